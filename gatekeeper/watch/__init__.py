"""Watching and reporting: status --watch, the HTML report, the Prometheus exporter."""
