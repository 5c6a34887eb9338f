"""``demoforge view``: a segment-aware episode viewer in the browser, for stores and exported datasets.

Modules: ``source`` reads a store or dataset into what the page shows (the one place that knows their
layout), ``files`` pins a dataset version's files and maps URL paths onto them safely, ``remux`` turns a
staged camera stream into a plain mp4 without re-encoding, ``server`` serves the page over HTTP,
``static_site`` writes the same page as a folder that opens from disk, ``static/`` holds the hand-written
page (HTML, JS, CSS; no CDN, no build step).
"""
