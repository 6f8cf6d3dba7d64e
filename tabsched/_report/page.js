// tabsched's HTML report: draws every chart of the page's data (the JSON in
// #tabsched-data), zoom and pan, the tooltip. tabsched/report.py inlines it.
(function () {
"use strict";
var COLORS = {F: "#0072B2", B: "#E69F00", I: "#D55E00", W: "#009E73", overlap: "#CC79A7",
  optimizer: "#999999", activation: "#56B4E9", gradient: "#F0E442", sync: "#7F3C8D"};
var KIND_NAMES = {F: "forward", B: "backward", I: "input-grad", W: "weight-grad",
  overlap: "overlapped forward and backward", activation: "activation transfer",
  gradient: "gradient transfer", optimizer: "optimizer step", sync: "gradient sync"};
var LINE_COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9",
  "#F0E442", "#000000"];
var data = JSON.parse(document.getElementById("tabsched-data").textContent);
var tip = document.getElementById("tip");
var holder = document.getElementById("charts");

function esc(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;");
}
function number(value) {
  var text = value.toPrecision(4);
  return String(parseFloat(text));
}
function add(parent, tag, cls, text) {
  var node = document.createElement(tag);
  if (cls) { node.className = cls; }
  if (text !== undefined) { node.textContent = text; }
  parent.appendChild(node);
  return node;
}
function ticks(t0, t1, count) {
  var span = t1 - t0, raw = span / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
  var step = [1, 2, 5, 10].map(function (m) { return m * power; })
    .filter(function (s) { return s >= raw; })[0];
  var out = [], t = Math.ceil(t0 / step) * step;
  for (; t <= t1 + step * 1e-9; t += step) { out.push(t); }
  return out;
}
function showTip(event, lines) {
  tip.textContent = "";
  add(tip, "b", null, lines[0]);
  for (var k = 1; k < lines.length; k++) { add(tip, "div", null, lines[k]); }
  tip.hidden = false;
  var x = event.clientX + 14, y = event.clientY + 14;
  var box = tip.getBoundingClientRect();
  if (x + box.width > window.innerWidth) { x = Math.max(0, event.clientX - box.width - 14); }
  if (y + box.height > window.innerHeight) { y = Math.max(0, event.clientY - box.height - 14); }
  tip.style.left = x + "px";
  tip.style.top = y + "px";
}
function hideTip() { tip.hidden = true; }

function chart(spec, index) {
  var box = add(holder, "section", "chart");
  box.id = "chart-" + index;
  add(box, "h3", null, spec.heading || spec.name);
  spec.summary.forEach(function (line) { add(box, "div", null, line); });
  (spec.notes || []).forEach(function (line) { add(box, "div", "note", "note: " + line); });
  var scale = spec.scale, unit = spec.unit, end = spec.makespan > 0 ? spec.makespan : 1;
  var view = {t0: 0, t1: end * 1.01};
  var redraws = [];
  var width = Math.max(600, Math.min(1600, (holder.clientWidth || 1000) - 4));
  var left = 92, right = 12, plot = width - left - right;
  function x(t) { return left + (t - view.t0) / (view.t1 - view.t0) * plot; }
  function timeAt(px) { return view.t0 + (px - left) / plot * (view.t1 - view.t0); }
  function shown(t) {
    if (!spec.seconds) { return number(t * scale) + " " + unit; }
    var size = Math.abs(t);
    if (size >= 1 || size === 0) { return number(t) + " s"; }
    if (size >= 1e-3) { return number(t * 1e3) + " ms"; }
    if (size >= 1e-6) { return number(t * 1e6) + " \u00b5s"; }
    return number(t * 1e9) + " ns";
  }
  function axis(group, top, height) {
    var parts = [];
    ticks(view.t0, view.t1, 8).forEach(function (t) {
      var px = x(t);
      if (px < left - 0.5 || px > left + plot + 0.5) { return; }
      parts.push('<line x1="' + px + '" x2="' + px + '" y1="' + top + '" y2="' +
                 (top + height) + '"></line><text x="' + px + '" y="' + (top - 4) +
                 '" text-anchor="middle">' + esc(number(t * scale)) + '</text>');
    });
    parts.push('<text x="' + (left + plot) + '" y="' + (top + height + 14) +
               '" text-anchor="end">time (' + esc(unit) + ')</text>');
    group.innerHTML = parts.join("");
  }
  var tools = add(box, "div", "tools");
  var zoomIn = add(tools, "button", "zoom-in", "zoom in");
  var zoomOut = add(tools, "button", "zoom-out", "zoom out");
  var back = add(tools, "button", "pan-left", "\u2190");
  var ahead = add(tools, "button", "pan-right", "\u2192");
  var reset = add(tools, "button", "reset", "reset");
  var where = add(tools, "span", "view");
  add(tools, "span", null, "wheel: zoom, drag: pan, hover a bar for its details");
  function setView(t0, t1) {
    var span = Math.max(t1 - t0, end * 1e-6);
    view.t0 = t0; view.t1 = t0 + span;
    where.textContent = "showing " + shown(view.t0) + " to " + shown(view.t1);
    redraws.forEach(function (draw) { draw(); });
  }
  function zoom(factor, at) {
    if (at === undefined) { at = (view.t0 + view.t1) / 2; }
    setView(at - (at - view.t0) * factor, at + (view.t1 - at) * factor);
  }
  zoomIn.onclick = function () { zoom(0.5); };
  zoomOut.onclick = function () { zoom(2); };
  function pan(share) {
    var step = (view.t1 - view.t0) * share;
    setView(view.t0 + step, view.t1 + step);
  }
  back.onclick = function () { pan(-0.25); };
  ahead.onclick = function () { pan(0.25); };
  reset.onclick = function () { setView(0, end * 1.01); };
  function interactive(svg) {
    svg.addEventListener("wheel", function (event) {
      event.preventDefault();
      var at = timeAt(event.clientX - svg.getBoundingClientRect().left);
      zoom(event.deltaY < 0 ? 0.8 : 1.25, at);
    }, {passive: false});
    var drag = null;
    svg.addEventListener("mousedown", function (event) {
      drag = {x: event.clientX, t0: view.t0, t1: view.t1};
      svg.classList.add("dragging");
    });
    window.addEventListener("mousemove", function (event) {
      if (!drag) { return; }
      var dt = (event.clientX - drag.x) / plot * (drag.t1 - drag.t0);
      setView(drag.t0 - dt, drag.t1 - dt);
    });
    window.addEventListener("mouseup", function () {
      drag = null; svg.classList.remove("dragging");
    });
  }

  var gantt = spec.gantt;
  if (gantt.note) { add(box, "p", "note", gantt.note); }
  if (gantt.bars.length) {
    var lanes = gantt.lanes, devices = gantt.devices, tops = [], y = 22;
    lanes.forEach(function (name, k) {
      var tall = k < devices ? 22 : 12;
      tops.push([y, tall]);
      y += tall + 4;
    });
    var height = y + 20;
    var holderDiv = add(box, "div", "gantt-holder");
    var clip = "clip-" + index;
    var parts = ['<svg class="gantt" width="' + width + '" height="' + height + '">',
      '<defs><clipPath id="' + clip + '"><rect x="' + left + '" y="0" width="' + plot +
      '" height="' + height + '"></rect></clipPath></defs><g class="axis"></g>'];
    lanes.forEach(function (name, k) {
      var middle = tops[k][0] + tops[k][1] / 2 + 4;
      parts.push('<text class="lane" x="' + (left - 6) + '" y="' + middle +
                 '" text-anchor="end">' + esc(name) + '</text>');
    });
    parts.push('<g clip-path="url(#' + clip + ')">');
    lanes.forEach(function (name, k) {
      parts.push('<rect class="idle" x="' + left + '" y="' + tops[k][0] + '" width="' + plot +
                 '" height="' + tops[k][1] + '" fill="#f0f0f0"></rect>');
    });
    gantt.bars.forEach(function (bar, i) {
      var lane = tops[bar[0]], kind = bar[3];
      var cls = "bar " + (bar[0] < devices && kind !== "optimizer" ? "op" :
                          kind === "activation" || kind === "gradient" ? "xfer" : "tail");
      if (bar[6]) { cls += " crit"; }
      parts.push('<rect class="' + cls + '" data-i="' + i + '" y="' + lane[0] + '" height="' +
                 lane[1] + '" fill="' + (COLORS[kind] || "#888") + '"></rect>');
    });
    parts.push("</g></svg>");
    holderDiv.innerHTML = parts.join("");
    var svg = holderDiv.firstChild, rects = svg.querySelectorAll("rect.bar");
    var ganttAxis = svg.querySelector("g.axis");
    redraws.push(function () {
      for (var i = 0; i < rects.length; i++) {
        var bar = gantt.bars[i], a = x(bar[1]), b = x(bar[2]);
        rects[i].setAttribute("x", a);
        rects[i].setAttribute("width", Math.max(b - a, 2));
      }
      axis(ganttAxis, 20, height - 38);
    });
    svg.addEventListener("mouseover", function (event) {
      var i = event.target.getAttribute("data-i");
      if (i === null) { return; }
      var bar = gantt.bars[+i];
      showTip(event, [bar[4], (KIND_NAMES[bar[3]] || bar[3]) + " on " + lanes[bar[0]],
        "start " + shown(bar[1]) + ", end " + shown(bar[2]) + " (" + shown(bar[2] - bar[1]) + ")",
        bar[5]].concat(bar[6] ? ["on the critical path"] : []));
    });
    svg.addEventListener("mousemove", function (event) {
      if (event.target.getAttribute("data-i") !== null && !tip.hidden) {
        tip.style.left = (event.clientX + 14) + "px"; tip.style.top = (event.clientY + 14) + "px";
      }
    });
    svg.addEventListener("mouseout", function (event) {
      if (event.target.getAttribute("data-i") !== null) { hideTip(); }
    });
    interactive(svg);
    var legend = add(box, "div", "legend"), seen = {};
    gantt.bars.forEach(function (bar) { seen[bar[3]] = true; });
    Object.keys(seen).forEach(function (kind) {
      var item = add(legend, "span");
      add(item, "i").style.background = COLORS[kind] || "#888";
      item.appendChild(document.createTextNode(KIND_NAMES[kind] || kind));
    });
    var crit = add(legend, "span");
    add(crit, "i").style.border = "1.5px solid #000";
    crit.appendChild(document.createTextNode("critical path (outlined)"));
  }

  var memory = spec.memory;
  if (memory && memory.lines.length) {
    add(box, "div", null, "memory per device, persistent + activations (" + memory.unit +
        "), against " + (memory.limits.length ? memory.limits.map(function (l) {
          return l.name + " " + number(l.value) + " " + memory.unit; }).join(", ") :
          "no budget (none given)"));
    if (memory.note) { add(box, "p", "note", memory.note); }
    var mheight = 220, mtop = 22, mplot = mheight - mtop - 30, top = 0;
    memory.lines.forEach(function (line) {
      line.points.forEach(function (p) { if (p[1] > top) { top = p[1]; } });
      if (line.persistent > top) { top = line.persistent; }
    });
    memory.limits.forEach(function (l) { if (l.value > top) { top = l.value; } });
    top = top > 0 ? top * 1.05 : 1;
    function my(v) { return mtop + mplot - v / top * mplot; }
    var mdiv = add(box, "div", "memory-holder");
    var mclip = "mclip-" + index;
    var mparts = ['<svg class="memory" width="' + width + '" height="' + mheight + '">',
      '<defs><clipPath id="' + mclip + '"><rect x="' + left + '" y="0" width="' + plot +
      '" height="' + mheight + '"></rect></clipPath></defs><g class="axis"></g>' +
      '<g class="yaxis axis">'];
    ticks(0, top, 4).forEach(function (v) {
      mparts.push('<text x="' + (left - 6) + '" y="' + (my(v) + 4) + '" text-anchor="end">' +
                  esc(number(v)) + '</text>');
    });
    mparts.push('</g><g class="lines" clip-path="url(#' + mclip + ')"></g></svg>');
    mdiv.innerHTML = mparts.join("");
    var msvg = mdiv.firstChild, mlines = msvg.querySelector("g.lines");
    var maxis = msvg.querySelector("g.axis");
    redraws.push(function () {
      var out = [];
      memory.lines.forEach(function (line, d) {
        var path = ["M", x(0), my(line.persistent)], last = line.persistent;
        line.points.forEach(function (p) {
          path.push("H", x(p[0]).toFixed(1), "V", my(p[1]).toFixed(1)); last = p[1];
        });
        path.push("H", x(end));
        out.push('<path class="mem" data-d="' + d + '" fill="none" stroke-width="1.4" stroke="' +
                 LINE_COLORS[d % LINE_COLORS.length] + '" d="' + path.join(" ") +
                 '"><title>device ' + d + '</title></path>');
      });
      memory.limits.forEach(function (l, k) {
        out.push('<line x1="' + left + '" x2="' + (left + plot) + '" y1="' + my(l.value) +
                 '" y2="' + my(l.value) + '" stroke="' + (k ? "#800" : "#C00000") +
                 '" stroke-dasharray="6 4"><title>' + esc(l.name + " " + number(l.value) + " " +
                 memory.unit) + '</title></line>');
      });
      mlines.innerHTML = out.join("");
      axis(maxis, mtop, mplot);
    });
    msvg.addEventListener("mousemove", function (event) {
      var t = timeAt(event.clientX - msvg.getBoundingClientRect().left);
      if (t < 0 || t > end) { hideTip(); return; }
      var lines = ["at " + shown(t)];
      memory.lines.forEach(function (line) {
        var value = line.persistent, lo = 0, hi = line.points.length - 1, at = -1;
        while (lo <= hi) {
          var mid = (lo + hi) >> 1;
          if (line.points[mid][0] <= t) { at = mid; lo = mid + 1; } else { hi = mid - 1; }
        }
        if (at >= 0) { value = line.points[at][1]; }
        lines.push("device " + line.device + ": " + number(value) + " " + memory.unit);
      });
      showTip(event, lines.slice(0, 18).concat(lines.length > 18 ? ["..."] : []));
    });
    msvg.addEventListener("mouseleave", hideTip);
    interactive(msvg);
    var mlegend = add(box, "div", "legend");
    memory.lines.slice(0, 32).forEach(function (line, d) {
      var item = add(mlegend, "span");
      add(item, "i").style.background = LINE_COLORS[d % LINE_COLORS.length];
      item.appendChild(document.createTextNode("device " + line.device));
    });
  }
  setView(0, end * 1.01);
}

data.charts.forEach(chart);
})();
