"""Tests of fedcluster_app.core's own modules (its sub-packages have folders of their own)."""
