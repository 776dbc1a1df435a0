"""Register one marker per task, so `pytest assignments/a0_memory -m task0_3` runs task 0.3 alone."""

TASKS = ("0_1", "0_2", "0_3", "0_4", "0_5", "0_6")


def pytest_configure(config):
    for task in TASKS:
        config.addinivalue_line("markers", f"task{task}: a0 task {task.replace('_', '.')}")
