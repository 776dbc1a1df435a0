"""A Triton kernel's launches, recorded (pytest puts tests/ on sys.path; the interpreter workers too)."""


class RecordedLaunches:
    """Stands in for a @triton.jit kernel in its module: `kernel[grid](*args, **kwargs)` appends
    (grid, kwargs) to `.seen`, then launches the real kernel."""

    def __init__(self, kernel):
        self.kernel, self.seen = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append((grid, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch
