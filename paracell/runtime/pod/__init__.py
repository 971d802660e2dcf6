"""Pods: one VM per Kubernetes pod."""
