"""Deployment scripts and the demos (``python deploy/demo.py``); the demos' helpers are shared as ``deploy.demo``."""
