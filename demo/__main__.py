"""`python -m demo` (`make demo`): the whole product on this machine, in one command (see demo.run)."""

import sys

from demo.run import main

sys.exit(main())
