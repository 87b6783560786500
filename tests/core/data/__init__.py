"""Tests of fedcluster_app.core.data: scenarios, drift, loaders, a user's data."""
