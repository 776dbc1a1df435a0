"""Register one marker per task, so `pytest assignments/a2_collectives -m task2_1` runs task 2.1 alone."""

TASKS = ("2_1", "2_2", "2_3", "2_4")


def pytest_configure(config):
    for task in TASKS:
        config.addinivalue_line("markers", f"task{task}: a2 task {task.replace('_', '.')}")
