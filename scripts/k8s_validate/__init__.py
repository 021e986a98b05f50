"""Render the k8s/ overlays and check them (CI tooling over a checkout, not in the wheel):
`python -m scripts.k8s_validate [OVERLAY ...]` from the repository root prints every problem, exit 1
if there are any. `render` (kubectl kustomize, lookups), `schemas` (KubeRay CRDs, Kubernetes core),
`exposure` (what is reachable from outside, secrets), `kuberay` (the operator's own rules,
draining), `check` (all of them, and the command)."""
