"""`import deep_ep` answered by epcomm.

Install this package (``pip install python/deep_ep_shim``) only where epcomm should stand in for
deep_ep everywhere, e.g. to run deep_ep's own tests (their rank processes import deep_ep anew) or a
framework that imports deep_ep by name in processes you do not start. It cannot be installed
beside a real deep_ep (the same package name). In one process you start yourself,
``epcomm.install_as_deep_ep()`` does the same without installing anything.
"""

__epcomm_shim__ = True

import epcomm  # noqa: E402

epcomm.install_as_deep_ep()  # from here on sys.modules["deep_ep"] is epcomm, and "deep_ep.utils" epcomm.utils
