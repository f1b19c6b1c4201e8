"""Runs the Python SDK tests (tests/python/*_test.py) with unittest. Exits 77 (CTest's SKIP_RETURN_CODE)
when ktune's native module cannot be imported, so that a build without it shows the suite as
skipped rather than passed; otherwise the exit code is unittest's.
    python3 tests/python/run_tests.py [-k PATTERN]   (PYTHONPATH=<build>/python)
"""
import os
import sys
import unittest

try:
    from ktune import _ktune  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: ktune's native module is not importable ({e}); build the _ktune target", flush=True)
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
loader = unittest.TestLoader()
if len(sys.argv) > 2 and sys.argv[1] == "-k":
    loader.testNamePatterns = [f"*{sys.argv[2]}*"]
suite = loader.discover(here, pattern="*_test.py", top_level_dir=here)
result = unittest.TextTestRunner(verbosity=2).run(suite)
if result.testsRun == 0 or len(result.skipped) == result.testsRun:
    print("SKIPPED: no test ran", flush=True)
    sys.exit(77)
sys.exit(0 if result.wasSuccessful() else 1)
