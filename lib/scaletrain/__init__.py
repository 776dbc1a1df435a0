"""scaletrain: the minimal reference library behind the course.

Each subpackage is one technique (see README's course map); nothing is imported eagerly so
that `import scaletrain.comm` does not pay for the kernels or the pipeline.
"""

__version__ = "0.1.0"

import os as _os

if _os.environ.get("SCALETRAIN_STUDENT_FILES"):  # a notebook chose student code (student_code.implementation):
    from scaletrain.student_code import install_finder as _install  # ranks it spawns import it too

    _install()
