"""plotly.js and the figures packed for a self-contained page: gzip, as base-85 text, unpacked by the browser.

The installed plotly package ships one bundle, the whole of plotly.js (4.8 MB; no partial bundle to
take only the bar, scatter and heat-map traces the report draws). Gzip-compressed and written as
base-85 text it is 1.8 MB; the page unpacks it once with the browser's own `DecompressionStream`
(Chrome/Edge 80, Firefox 113, Safari 16.4), runs it, then draws each figure from its own packed JSON.
Nothing is fetched. The base-85 alphabet is Python's (`base64.b85encode`) with ``<`` written as ``.``,
so packed text holds no ``<`` and cannot end or confuse the ``<script>`` element that carries it.
"""

from __future__ import annotations

import base64
import functools
import gzip

_FROM, _TO = b"<", b"."
_TABLE = bytes.maketrans(_FROM, _TO)
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~".replace("<", ".")
DATA_TYPE = "application/x-tracediag-packed"
"""The ``type`` of the ``<script>`` elements that carry packed text (a type browsers do not run)."""


def pack(data: bytes) -> str:
    """`data` gzip-compressed, as base-85 text without ``<``."""
    return base64.b85encode(gzip.compress(data, 9, mtime=0)).translate(_TABLE).decode("ascii")


def unpack(text: str) -> bytes:
    """The bytes `pack` packed (for tests and tools reading a report)."""
    return gzip.decompress(base64.b85decode(text.encode("ascii").translate(bytes.maketrans(_TO, _FROM))))


@functools.cache
def plotly_js() -> tuple[str, int]:
    """plotly.js packed (computed once per process, about 1 s) and its unpacked size in bytes."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs().encode()
    return pack(js), len(js)


def packed_block(text: str, **attrs: str) -> str:
    """A ``<script>`` element carrying packed text; `attrs` as HTML attributes (``data_for``: ``data-for``)."""
    more = "".join(f' {k.rstrip("_").replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<script type="{DATA_TYPE}"{more}>{text}</script>'


_LOADER = """(async () => {
  const A = "%s", M = new Uint8Array(128);
  for (let i = 0; i < 85; i++) M[A.charCodeAt(i)] = i;
  const b85 = (s) => {
    const n = s.length, r = n %% 5, out = new Uint8Array(Math.floor(n / 5) * 4 + (r ? r - 1 : 0));
    let o = 0;
    for (let i = 0; i < n; i += 5) {
      let v = 0;
      for (let j = 0; j < 5; j++) v = v * 85 + (i + j < n ? M[s.charCodeAt(i + j)] : 84);
      for (let j = 0, k = Math.min(4, n - i - 1); j < k; j++) out[o++] = (v >>> (24 - 8 * j)) & 255;
    }
    return out;
  };
  const unpack = (el) => new Response(new Blob([b85(el.textContent.trim())]).stream()
    .pipeThrough(new DecompressionStream("gzip"))).text();
  if (typeof DecompressionStream === "undefined") {
    document.getElementById("td-unpack").hidden = false;
    return;
  }
  const js = document.createElement("script");
  js.textContent = await unpack(document.getElementById("td-plotly"));
  document.head.appendChild(js);
  for (const el of document.querySelectorAll("script.td-figure")) {
    const f = JSON.parse(await unpack(el));
    await Plotly.newPlot(el.dataset.for, f.data, f.layout, f.config);
  }
})().catch((e) => console.error("tracediag report: " + e));"""


def loader() -> str:
    """The page's last elements: packed plotly.js and the script that unpacks it and draws the figures."""
    packed, _ = plotly_js()
    return packed_block(packed, id="td-plotly") + f"<script>{_LOADER % ALPHABET}</script>"
