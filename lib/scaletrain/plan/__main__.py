import sys

from scaletrain.plan.cli import main

sys.exit(main())
