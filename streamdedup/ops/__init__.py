"""What operators see: logs, metrics and health, progress bars, run summaries."""
