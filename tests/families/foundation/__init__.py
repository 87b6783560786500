"""Tests of fedcluster_app.families.foundation."""
