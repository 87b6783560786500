"""Tests of fedcluster_app.families.flexcfl."""
