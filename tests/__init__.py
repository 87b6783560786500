"""The test suite, laid out as the package is: ``tests/<part>/`` tests ``fedcluster_app/<part>/``
(the app modules, ``cli.py``, ``api.py`` ..., at the top level), ``tests/repo/`` checks the
repository as a whole (README, docs, bundle, structure, benchmark scripts). Each folder is a
package, so test modules are imported by their full name (``tests.core.data.test_tables``);
what several of them share is in ``tests/support.py``."""
