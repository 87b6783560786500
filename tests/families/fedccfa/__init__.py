"""Tests of fedcluster_app.families.fedccfa."""
