"""scaletrain: the minimal reference library behind the course.

Each subpackage is one technique (see README's course map); nothing is imported eagerly so
that `import scaletrain.comm` does not pay for the kernels or the pipeline.
"""

__version__ = "0.1.0"
