"""Test job: writes its pid to argv[1] and sleeps (to be stopped by the test)."""

import os
import sys
import time

with open(sys.argv[1], "w") as out:
    out.write(str(os.getpid()))
print("sleeping", flush=True)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 120)
