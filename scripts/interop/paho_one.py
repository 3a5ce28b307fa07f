# Runs one test of a paho interop suite against PORT without editing the suite:
# the suite's own getopt sees -p PORT, unittest.main sees only the test name.
import os, runpy, sys, unittest
sys.path.insert(0, os.getcwd())
suite, port, test = sys.argv[1], sys.argv[2], sys.argv[3]
orig = unittest.main
unittest.main = lambda *a, **k: orig(argv=[suite, test])
sys.argv = [suite, "-p", port]
runpy.run_path(suite, run_name="__main__")
