"""Register one marker per task, so `pytest assignments/a3_data_parallel -m task3_2` runs task 3.2 alone."""

TASKS = ("3_1", "3_2", "3_3")


def pytest_configure(config):
    for task in TASKS:
        config.addinivalue_line("markers", f"task{task}: a3 task {task.replace('_', '.')}")
