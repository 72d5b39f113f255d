// Tiny SVG charts for the status page: time-series lines and bars. No dependencies.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#d97706", "#0891b2"];

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, value);
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const step = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

function axisLabel(v) {
  if (v === 0) return "0";
  if (v >= 1000) return `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k`;
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1).replace(/\.0$/, "") : String(+v.toPrecision(2));
}

function frame(svg) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const box = svg.getBoundingClientRect();
  const width = Math.max(box.width, 200), height = Math.max(box.height, 100);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  return { width, height, left: 42, right: 8, top: 8, bottom: 18 };
}

function yAxis(svg, f, yMax, fmt) {
  for (let i = 0; i <= 4; i++) {
    const y = f.top + (f.height - f.top - f.bottom) * (1 - i / 4);
    svg.appendChild(svgEl("line", { class: "axis", x1: f.left, x2: f.width - f.right, y1: y, y2: y }));
    svg.appendChild(svgEl("text", { x: f.left - 4, y: y + 3, "text-anchor": "end" }, fmt(yMax * i / 4)));
  }
}

// series: [{label, points: [{t, v}]}] with t in unix seconds; the x axis is the last `spanS`.
function lineChart(svg, series, opts) {
  const f = frame(svg);
  const spanS = (opts && opts.spanS) || 120;
  const now = (opts && opts.now) || Date.now() / 1000;
  const fmt = axisLabel;
  let yMax = 0, drawn = 0;
  for (const s of series) for (const p of s.points) if (p.v != null) yMax = Math.max(yMax, p.v);
  yMax = niceMax(yMax * 1.05);
  yAxis(svg, f, yMax, fmt);
  const x = (t) => f.left + (f.width - f.left - f.right) * (1 - (now - t) / spanS);
  const y = (v) => f.top + (f.height - f.top - f.bottom) * (1 - v / yMax);
  for (const [label, at] of [[`-${spanS}s`, now - spanS], [`-${spanS / 2}s`, now - spanS / 2], ["now", now]]) {
    svg.appendChild(svgEl("text", { x: x(at), y: f.height - 4, "text-anchor": "middle" }, label));
  }
  series.forEach((s, i) => {
    const pts = s.points.filter((p) => p.v != null && now - p.t <= spanS);
    const color = s.color || PALETTE[i % PALETTE.length];
    if (pts.length) {
      const line = svgEl("polyline", {
        points: pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" "),
        stroke: color, "data-series": s.label, "data-points": pts.length,
      });
      if (s.dashed) line.setAttribute("stroke-dasharray", "4 3");
      svg.appendChild(line);
      drawn += pts.length;
    }
    const legend = svgEl("text", { class: "legend", x: f.left + 6 + i * 90, y: f.top + 10 }, s.label);
    legend.style.fill = color;  // CSSOM, which the page's CSP allows (style attributes it does not)
    svg.appendChild(legend);
  });
  svg.dataset.points = String(drawn);
  if (!drawn) {
    svg.appendChild(svgEl("text", { x: f.width / 2, y: f.height / 2, "text-anchor": "middle" }, (opts && opts.empty) || "no traffic yet"));
  }
}

// bars: [{label, value}]
function barChart(svg, bars) {
  const f = frame(svg);
  const yMax = niceMax(Math.max(0, ...bars.map((b) => b.value)));
  yAxis(svg, f, yMax, axisLabel);
  const inner = f.width - f.left - f.right, h = f.height - f.top - f.bottom;
  const slot = bars.length ? inner / bars.length : inner;
  bars.forEach((b, i) => {
    const bh = h * b.value / yMax;
    svg.appendChild(svgEl("rect", { class: "bar-rect", x: f.left + i * slot + slot * 0.15, width: slot * 0.7,
                                    y: f.top + h - bh, height: Math.max(bh, 0.5), "data-label": b.label,
                                    "data-value": b.value }));
    svg.appendChild(svgEl("text", { x: f.left + i * slot + slot / 2, y: f.height - 4, "text-anchor": "middle" }, b.label));
  });
  svg.dataset.points = String(bars.length);
  if (!bars.length) {
    svg.appendChild(svgEl("text", { x: f.width / 2, y: f.height / 2, "text-anchor": "middle" }, "no batches yet"));
  }
}

window.ServalCharts = { lineChart, barChart };
