"""The interactive attention page: one self-contained HTML file (inline CSS, JS and data; no network).

In the manner of bertviz's head view: the tokens in two columns (queries left, keys right), a line
from each query to each key weighted by the attention, a layer and a head selector (or the mean of
the heads), and hovering a token shows only its row (left) or its column (right). The page reads
`#layer=L&head=H&focus=I` from its address (so a test can drive it), writes any script error into
the element #errors, and reports what it drew in data- attributes of <body>.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from attnlab.viz.attention import AttentionMaps

_STYLE = """
body { font-family: sans-serif; margin: 1em; color: #222; }
#controls { margin-bottom: 0.8em; }
#view { display: flex; align-items: flex-start; }
.col { display: flex; flex-direction: column; }
.tok { height: 20px; line-height: 20px; padding: 0 6px; font-family: monospace; font-size: 14px;
       cursor: default; white-space: pre; border-radius: 3px; }
.q { text-align: right; } .k { text-align: left; }
.tok.on { background: #f4a261; }
#errors { color: #b00020; font-family: monospace; white-space: pre-wrap; }
.caption { color: #555; font-size: 13px; max-width: 46em; }
"""

_SCRIPT = r"""
(function () {
  var errors = document.getElementById("errors");
  window.onerror = function (msg, src, line) { errors.textContent += msg + " (line " + line + ")\n"; };
  var data = JSON.parse(document.getElementById("data").textContent);
  var L = data.weights.length, H = data.weights[0].length;
  var T = data.query_tokens.length, S = data.key_tokens.length;
  var layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
  var canvas = document.getElementById("lines"), ctx = canvas.getContext("2d");
  var left = document.getElementById("queries"), right = document.getElementById("keys");
  var ROW = 20, focus = null, side = null;
  function option(sel, value, text) { var o = document.createElement("option"); o.value = value;
    o.textContent = text; sel.appendChild(o); }
  for (var l = 0; l < L; l++) option(layerSel, l, "layer " + l);
  option(headSel, "mean", "mean of heads");
  for (var h = 0; h < H; h++) option(headSel, h, "head " + h);
  function token(col, text, i, cls) { var d = document.createElement("div"); d.className = "tok " + cls;
    d.textContent = text; d.dataset.index = i; col.appendChild(d); return d; }
  var qs = data.query_tokens.map(function (t, i) { return token(left, t, i, "q"); });
  var ks = data.key_tokens.map(function (t, j) { return token(right, t, j, "k"); });
  canvas.width = 220; canvas.height = ROW * Math.max(T, S);
  function weights() {
    var l = +layerSel.value, h = headSel.value;
    if (h !== "mean") return data.weights[l][+h];
    var m = [];
    for (var i = 0; i < T; i++) { m.push([]); for (var j = 0; j < S; j++) { var s = 0;
      for (var k = 0; k < H; k++) s += data.weights[l][k][i][j]; m[i].push(s / H); } }
    return m;
  }
  function draw() {
    var w = weights(), n = 0;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    for (var i = 0; i < T; i++) for (var j = 0; j < S; j++) {
      if (focus !== null && ((side === "q" && i !== focus) || (side === "k" && j !== focus))) continue;
      if (w[i][j] < 0.01) continue;
      ctx.strokeStyle = "rgba(38, 70, 160, " + Math.min(1, w[i][j]) + ")";
      ctx.lineWidth = 1 + 3 * w[i][j];
      ctx.beginPath(); ctx.moveTo(0, ROW * i + ROW / 2); ctx.lineTo(canvas.width, ROW * j + ROW / 2); ctx.stroke();
      n++;
    }
    qs.forEach(function (d, i) { d.classList.toggle("on", side === "q" && i === focus); });
    ks.forEach(function (d, j) { d.classList.toggle("on", side === "k" && j === focus); });
    document.body.dataset.lines = n;
    document.body.dataset.layer = layerSel.value; document.body.dataset.head = headSel.value;
    document.body.dataset.focus = focus === null ? "" : side + focus;
  }
  function hover(list, which) { list.forEach(function (d, i) {
    d.addEventListener("mouseenter", function () { focus = i; side = which; draw(); });
    d.addEventListener("mouseleave", function () { focus = null; side = null; draw(); }); }); }
  hover(qs, "q"); hover(ks, "k");
  layerSel.onchange = draw; headSel.onchange = draw;
  var args = {};
  location.hash.replace(/^#/, "").split("&").forEach(function (p) { var kv = p.split("=");
    if (kv[0]) args[kv[0]] = kv[1]; });
  layerSel.value = args.layer !== undefined ? args.layer : data.layer;
  headSel.value = args.head !== undefined ? args.head : data.head;
  if (args.focus !== undefined) { focus = +args.focus; side = "q"; }
  draw();
  document.body.dataset.ready = "1";
})();
"""


def attention_page(maps: AttentionMaps, layer: int, head: int | None, caption: str = "") -> str:
    """The page as a string: everything inline, no external reference.

    Args:
        layer, head: what the selectors show first (head None: the mean of the heads).
    """
    data = {"query_tokens": maps.query_tokens, "key_tokens": maps.key_tokens, "layer": layer,
            "head": "mean" if head is None else head,
            "weights": maps.weights.round(4).tolist()}
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    what = "cross-attention (decoder → encoder)" if maps.kind == "cross" else "self-attention"
    title = html.escape(f"Attention ({what}): {maps.model}")
    text = html.escape(maps.text + (f" → {maps.target}" if maps.target else ""))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{_STYLE}</style></head>
<body>
<h2>{title}</h2>
<p class="caption">{text}</p>
<p class="caption">{html.escape(caption)} Hover a token to see only its row (left) or column (right).</p>
<div id="controls"><select id="layer"></select> <select id="head"></select></div>
<div id="view"><div id="queries" class="col"></div><canvas id="lines"></canvas><div id="keys" class="col"></div></div>
<div id="errors"></div>
<script type="application/json" id="data">{payload}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_attention_page(maps: AttentionMaps, path, layer: int, head: int | None, caption: str = "") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(attention_page(maps, layer, head, caption), encoding="utf-8")
    return path
