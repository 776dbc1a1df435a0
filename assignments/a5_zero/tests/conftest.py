"""Register one marker per task, so `pytest assignments/a5_zero -m task5_2` runs task 5.2 alone."""

TASKS = ("5_1", "5_2", "5_3", "5_4")


def pytest_configure(config):
    for task in TASKS:
        config.addinivalue_line("markers", f"task{task}: a5 task {task.replace('_', '.')}")
