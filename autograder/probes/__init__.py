"""Probes: what the untrusted worker (`autograder.worker`) runs for a trusted group.

A probe loads the student's module, calls it on the inputs it is given and returns outputs as
data. It holds no expected value and decides nothing, so its source is public (it ships in the
student repository too); one module per assignment, plus `common` for plain function calls.
"""
