cd /work/wt/i23q
for i in 1 2; do .venv/bin/python /tmp/i23q/prof.py q8_0,q4_1,q4_0 1,8,16 2>&1 | grep -v Warn | sed 's/^/REPACK /'; done
