"""The platform on a multi-node Ray cluster on one machine (scripts/cluster_demo.py): `shape` (the
RayService's cluster), `local` (the cluster), `app` (the deployment), `traffic`, `observe`,
`scenarios`, `gcs`, `figures` (the summary), `plot` and `runner` (`run_demo`, `main`)."""
