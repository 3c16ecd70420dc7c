"""`python -m degnn.train <hydra overrides>`: the command every server and trainer process runs.

Started by `python -m degnn.launch` or by DGL's own tools/launch.py; see degnn/entry.py.
"""
import sys

from degnn.entry import main

if __name__ == "__main__":
    sys.exit(main())
