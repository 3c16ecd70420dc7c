"""`python -m degnn.train <hydra overrides>`: the command every server and trainer process runs.

Started by `python -m degnn.launch` or by DGL's own tools/launch.py; see degnn/entry.py.
"""
import sys

from degnn.startup import pause_collector

pause_collector()  # until start-up is over (degnn/startup.py)

from degnn.entry import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
