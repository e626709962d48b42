"""Dashboards, Prometheus config and rules for the local stack (generated where possible)."""
