"""Media fetching for chat requests: the one place where URLs, local paths and base64 data become bytes.

Owns nothing itself; the package's modules, by role:

* ``policy``: ``MediaSettings`` (allow-list, caps, timeouts, media root) and the host/port rule;
* ``addresses``: which IP addresses may be dialed;
* ``urls``: the one URL parser (``RemoteURL``);
* ``formats``: the accepted media formats, their MIME types and extensions;
* ``parts``: reading the five content-part formats into ``MediaRef``s and rewriting ``messages``;
* ``net``: the injectable resolver and dialer;
* ``fetch``: HTTP(S) downloads (resolve once, check every address, dial the checked IP, caps, redirects);
* ``local``: files under the media root (no ``..``, no symlinks, no special files);
* ``sniff``: content checks (magic bytes, image headers and pixel cap, audio/video headers);
* ``loader``: ``MediaLoader``, which loads a request's media concurrently;
* ``errors``: ``MediaError`` and its 400 envelope.

Nothing outside this package opens user-named files or URLs (``tests/media/test_choke_point.py``).
"""
