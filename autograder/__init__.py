"""The course autograder: release stubs and solutions, grade submissions, write results.json.

See autograder/README.md for how suites are written and `python -m autograder --help` for use.
"""
