"""Register one marker per task, so `pytest assignments/a4_pipeline -m task4_2` runs task 4.2 alone."""

TASKS = ("4_1", "4_2", "4_3", "4_4")


def pytest_configure(config):
    for task in TASKS:
        config.addinivalue_line("markers", f"task{task}: a4 task {task.replace('_', '.')}")
