"""No torch at all; exits with the code given as the first argument; reports what a subprocess sees."""

import os
import subprocess
import sys

child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('TRACETOOL_RECORD_DIR'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(f"grandchild sees {child}; marker {os.environ.get('USER_SITECUSTOMIZE_RAN')}")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
