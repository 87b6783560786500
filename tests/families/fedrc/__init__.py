"""Tests of fedcluster_app.families.fedrc."""
