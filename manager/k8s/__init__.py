"""Kubernetes rendering of the deployment registry: Deployment + Service, LeaderWorkerSet, production-stack values.

One module per job: pod.py (the pod every layout runs), planhash.py (the plan-hash annotation and the rank
check), deployment.py, lws.py, helm.py (the layouts), render.py (choose, check, dump, write). docs/kubernetes.md.
"""
