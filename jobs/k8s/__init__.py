"""`zmqflow k8s render`: the Kubernetes manifests of the shipped topology for any ps/worker count.

render.py builds them as plain dicts (ConfigMap, PVC, optional CURVE Secret, headless Services and
StatefulSets or a Kubeflow TFJob, Deployments) and writes them as YAML; deploy/k8s/ is its output
for 2 ps, 2 workers and 3 model servers.
"""
