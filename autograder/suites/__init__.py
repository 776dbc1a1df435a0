"""One module per assignment (`aN_topic.py`), each defining `MANIFEST` and its group functions."""
