import sys
from pathlib import Path

# The benchmark scripts import each other as plain modules.
sys.path.insert(0, str(Path(__file__).parent))
