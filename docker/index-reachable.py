#!/usr/bin/env python3
"""Exit 0 when a package index URL answers within 3 s, else 1. Standard library only.

An extra index that does not answer costs pip ~9 s of retries per requirement, so the Dockerfile
adds PyTorch's CPU index only after this says it is reachable. Honors SSL_CERT_FILE (the build's
optional CA secret).
    index-reachable.py URL
"""

import sys
import urllib.request

try:
    urllib.request.urlopen(sys.argv[1], timeout=3).close()
except Exception as exc:  # any failure means "do not use it"
    print(f"index-reachable: {sys.argv[1]} not reachable ({type(exc).__name__}); skipping it", file=sys.stderr)
    sys.exit(1)
