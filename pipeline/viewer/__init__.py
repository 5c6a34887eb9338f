"""``demoforge view``: a segment-aware episode viewer in the browser, for stores and exported datasets.

``source`` reads a store or dataset into what the page shows (the one module that knows their layout),
``files`` pins a dataset version's files and maps URL paths onto them safely, ``marks`` is a dataset's
rejected list (a file beside it, the one thing the page may change), ``remux`` turns a staged camera
stream into a plain mp4 without re-encoding, ``depth_preview`` colour-maps a depth camera into H.264 a
browser plays, ``pages`` is the URL space shared by the server and the static
folder, ``server`` serves the page over HTTP, ``static_site`` writes it as a folder that opens from disk,
``command`` is the CLI, and ``static/`` holds the hand-written page (HTML, JS, CSS; no CDN, no build step).
See docs/viewer.md.
"""
