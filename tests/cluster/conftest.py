"""tests/cluster: the shared harness lives in tests/http (dolphin_server.py,
ops_util.py); put it on the import path."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
