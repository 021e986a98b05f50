"""Scale-out on a running multi-node Ray cluster, on one machine: Ray's fake multi-node provider
shaped like k8s/'s RayService, the platform as `specserve up` deploys it, then load ramps, a
variant's pool across nodes, a node killed under load, scale-in and a GCS restart; prints the
targets and writes the JSON summary (specserve/tools/cluster). Usage: python scripts/cluster_demo.py
[--work-dir DIR] [--out summary.json] [--plot timeline.png] [--clients N] [--no-gcs]."""

from __future__ import annotations

import sys

from specserve.tools.cluster.runner import main

if __name__ == "__main__":
    sys.exit(main())
