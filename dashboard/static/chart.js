// ZsChart: the dashboard's small SVG charting library (line charts, stacked bars with markers,
// a horizontal segmented bar). No dependencies; every chart is a fresh <svg> element.
(function () {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";
  const PALETTE = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
  ];

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) node.setAttribute(key, String(value));
    }
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, attrs) {
    const node = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    node.textContent = content;
    return node;
  }

  // Round tick steps (1, 2, 5 x 10^k) so that axes read like a person drew them.
  function niceTicks(min, max, count) {
    if (!isFinite(min) || !isFinite(max)) return [0];
    if (min === max) {
      const pad = min === 0 ? 1 : Math.abs(min) * 0.1;
      min -= pad;
      max += pad;
    }
    const rough = (max - min) / Math.max(1, count);
    const magnitude = Math.pow(10, Math.floor(Math.log10(rough)));
    const residual = rough / magnitude;
    const step = (residual > 5 ? 10 : residual > 2 ? 5 : residual > 1 ? 2 : 1) * magnitude;
    const ticks = [];
    for (let v = Math.floor(min / step) * step; v <= max + step * 1e-9; v += step) {
      ticks.push(Math.abs(v) < step * 1e-9 ? 0 : v);
      if (ticks.length > 50) break;
    }
    if (ticks[ticks.length - 1] < max) ticks.push(ticks[ticks.length - 1] + step);
    return ticks;
  }

  function defaultFormat(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e4 || a < 1e-3) return v.toExponential(1);
    return String(Number(v.toPrecision(4)));
  }

  function formatBytes(bytes) {
    const n = Number(bytes) || 0;
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = n;
    let unit = 0;
    while (Math.abs(value) >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit++;
    }
    const digits = unit === 0 || Number.isInteger(value) ? 0 : 1;
    return value.toFixed(digits) + " " + units[unit];
  }

  // Byte axes step in round binary units (256 KiB, not 262.1 KB).
  function byteTicks(max, count) {
    let unit = 1;
    while (max / unit >= 1024 && unit < Math.pow(1024, 4)) unit *= 1024;
    return niceTicks(0, max / unit || 1, count).map((t) => t * unit);
  }

  function frame(opts) {
    const width = opts.width || 640;
    const height = opts.height || 260;
    const margin = Object.assign({ top: 16, right: 16, bottom: 40, left: 64 }, opts.margin || {});
    const svg = el("svg", {
      width: width, height: height, viewBox: "0 0 " + width + " " + height,
      class: "zs-chart", role: "img",
    });
    if (opts.chart) svg.setAttribute("data-chart", opts.chart);
    if (opts.title) el("title", {}, svg).textContent = opts.title;
    return {
      svg: svg, width: width, height: height, margin: margin,
      plotWidth: width - margin.left - margin.right,
      plotHeight: height - margin.top - margin.bottom,
    };
  }

  function yAxis(f, ticks, scaleY, format, label) {
    const axis = el("g", { class: "zs-axis zs-axis-y" }, f.svg);
    for (const t of ticks) {
      const y = scaleY(t);
      el("line", { x1: f.margin.left, x2: f.width - f.margin.right, y1: y, y2: y, class: "zs-grid" }, axis);
      text(axis, f.margin.left - 6, y + 4, format(t), { "text-anchor": "end" });
    }
    el("line", {
      x1: f.margin.left, x2: f.margin.left, y1: f.margin.top, y2: f.height - f.margin.bottom,
      class: "zs-axis-line",
    }, axis);
    if (label) {
      const x = 14;
      const y = f.margin.top + f.plotHeight / 2;
      text(axis, x, y, label, { transform: "rotate(-90 " + x + " " + y + ")", "text-anchor": "middle" });
    }
  }

  function xAxisLine(f, label) {
    const axis = el("g", { class: "zs-axis zs-axis-x" }, f.svg);
    const y = f.height - f.margin.bottom;
    el("line", { x1: f.margin.left, x2: f.width - f.margin.right, y1: y, y2: y, class: "zs-axis-line" }, axis);
    if (label) text(axis, f.margin.left + f.plotWidth / 2, f.height - 4, label, { "text-anchor": "middle" });
    return axis;
  }

  function legend(container, entries) {
    const box = document.createElement("div");
    box.className = "zs-legend";
    for (const entry of entries) {
      const item = document.createElement("span");
      item.className = "zs-legend-item";
      const swatch = document.createElement("span");
      swatch.className = "zs-swatch" + (entry.dashed ? " zs-swatch-dashed" : "");
      swatch.style.backgroundColor = entry.dashed ? "transparent" : entry.color;
      swatch.style.borderColor = entry.color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(entry.label));
      box.appendChild(item);
    }
    container.appendChild(box);
    return box;
  }

  // series: [{name, color, points: [{x, y, attrs}]}]; every point becomes a <circle> carrying
  // its attrs (the dashboard marks them data-point).
  function lineChart(series, opts) {
    opts = opts || {};
    const f = frame(opts);
    const all = series.flatMap((s) => s.points);
    const format = opts.format || defaultFormat;
    if (all.length === 0) {
      xAxisLine(f, opts.xLabel);
      text(f.svg, f.margin.left + f.plotWidth / 2, f.margin.top + f.plotHeight / 2,
        opts.emptyText || "no data yet", { "text-anchor": "middle", class: "zs-empty" });
      return f.svg;
    }
    const xs = all.map((p) => p.x);
    const ys = all.map((p) => p.y).filter((y) => isFinite(y));
    const xTicks = niceTicks(Math.min(...xs), Math.max(...xs), Math.max(2, Math.floor(f.plotWidth / 80)));
    const yTicks = niceTicks(Math.min(0, ...ys), ys.length ? Math.max(...ys) : 1, 5);
    const x0 = xTicks[0], x1 = xTicks[xTicks.length - 1];
    const y0 = yTicks[0], y1 = yTicks[yTicks.length - 1];
    const scaleX = (x) => f.margin.left + ((x - x0) / (x1 - x0 || 1)) * f.plotWidth;
    const scaleY = (y) => f.margin.top + f.plotHeight - ((y - y0) / (y1 - y0 || 1)) * f.plotHeight;
    yAxis(f, yTicks, scaleY, format, opts.yLabel);
    const axis = xAxisLine(f, opts.xLabel);
    for (const t of xTicks) {
      const x = scaleX(t);
      el("line", { x1: x, x2: x, y1: f.height - f.margin.bottom, y2: f.height - f.margin.bottom + 4, class: "zs-axis-line" }, axis);
      text(axis, x, f.height - f.margin.bottom + 16, defaultFormat(t), { "text-anchor": "middle" });
    }
    const radius = all.length > 400 ? 1 : 2.5;
    series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      const group = el("g", { class: "zs-series" }, f.svg);
      if (s.name) group.setAttribute("data-series", s.name);
      const finite = s.points.filter((p) => isFinite(p.y));
      if (finite.length > 1) {
        el("polyline", {
          points: finite.map((p) => scaleX(p.x).toFixed(1) + "," + scaleY(p.y).toFixed(1)).join(" "),
          fill: "none", stroke: color, "stroke-width": 1.5,
          // Overlaid series often coincide (ddp and zero2 are bitwise equal): dash all but the first.
          "stroke-dasharray": i > 0 ? ["6 4", "2 3", "8 3 2 3"][(i - 1) % 3] : null,
        }, group);
      }
      for (const p of finite) {
        const circle = el("circle", Object.assign({ cx: scaleX(p.x).toFixed(1), cy: scaleY(p.y).toFixed(1), r: radius, fill: color }, p.attrs || {}), group);
        // Tooltips only where there are few points: each is one more DOM node.
        if (all.length <= 400) el("title", {}, circle).textContent = (s.name ? s.name + " " : "") + "x=" + p.x + " y=" + format(p.y);
      }
    });
    return f.svg;
  }

  // bars: [{label, segments: [{value, color, attrs, title}], markers: [{value, color, dashed,
  // title}]}]: vertical stacked bars with a marker line across a bar at each marker's value.
  function stackedBars(bars, opts) {
    opts = opts || {};
    const f = frame(Object.assign({ margin: { bottom: opts.rotateLabels ? 96 : 40 } }, opts));
    const format = opts.format || defaultFormat;
    const tops = bars.map((b) => Math.max(
      b.segments.reduce((sum, s) => sum + Math.max(0, s.value), 0),
      ...(b.markers || []).map((m) => m.value)));
    const top = Math.max(0, ...tops) || 1;
    const yTicks = opts.bytes ? byteTicks(top, 5) : niceTicks(0, top, 5);
    const y1 = yTicks[yTicks.length - 1];
    const scaleY = (y) => f.margin.top + f.plotHeight - (y / (y1 || 1)) * f.plotHeight;
    yAxis(f, yTicks, scaleY, format, opts.yLabel);
    const axis = xAxisLine(f, opts.xLabel);
    if (bars.length === 0) {
      text(f.svg, f.margin.left + f.plotWidth / 2, f.margin.top + f.plotHeight / 2,
        opts.emptyText || "no data yet", { "text-anchor": "middle", class: "zs-empty" });
      return f.svg;
    }
    const slot = f.plotWidth / bars.length;
    const barWidth = Math.max(1, Math.min(slot * 0.7, opts.maxBarWidth || 60));
    const labelEvery = Math.max(1, Math.ceil(bars.length / Math.max(1, f.plotWidth / 40)));
    bars.forEach((bar, i) => {
      const x = f.margin.left + slot * i + (slot - barWidth) / 2;
      const group = el("g", { class: "zs-bar" }, f.svg);
      let base = 0;
      for (const segment of bar.segments) {
        const value = Math.max(0, segment.value);
        const yTop = scaleY(base + value);
        const rect = el("rect", Object.assign({
          x: x, y: yTop, width: barWidth, height: Math.max(0, scaleY(base) - yTop), fill: segment.color,
        }, segment.attrs || {}), group);
        if (segment.title) el("title", {}, rect).textContent = segment.title;
        base += value;
      }
      for (const marker of bar.markers || []) {
        const y = scaleY(marker.value);
        const line = el("line", {
          x1: x - 4, x2: x + barWidth + 4, y1: y, y2: y, stroke: marker.color || "#000",
          "stroke-width": 2, "stroke-dasharray": marker.dashed ? "4 3" : null, class: "zs-marker",
        }, group);
        if (marker.attrs) for (const [k, v] of Object.entries(marker.attrs)) line.setAttribute(k, String(v));
        if (marker.title) el("title", {}, line).textContent = marker.title;
      }
      if (i % labelEvery === 0) {
        const lx = x + barWidth / 2;
        const ly = f.height - f.margin.bottom + 14;
        text(axis, lx, ly, bar.label, opts.rotateLabels
          ? { "text-anchor": "end", transform: "rotate(-35 " + lx + " " + ly + ")" }
          : { "text-anchor": "middle" });
      }
    });
    return f.svg;
  }

  // segments: [{value, color, attrs, title, label}]: one horizontal bar split in proportion.
  function segmentedBar(segments, opts) {
    opts = opts || {};
    const f = frame(Object.assign({ height: opts.height || 56, margin: { top: 8, right: 8, bottom: 20, left: 8 } }, opts));
    const total = segments.reduce((sum, s) => sum + Math.max(0, s.value), 0);
    let x = f.margin.left;
    for (const segment of segments) {
      const width = total > 0 ? (Math.max(0, segment.value) / total) * f.plotWidth : 0;
      const rect = el("rect", Object.assign({
        x: x, y: f.margin.top, width: width, height: f.plotHeight, fill: segment.color,
        class: "zs-segment",
      }, segment.attrs || {}), f.svg);
      if (segment.title) el("title", {}, rect).textContent = segment.title;
      if (segment.label && width > 7 * segment.label.length) {
        text(f.svg, x + width / 2, f.margin.top + f.plotHeight / 2 + 4, segment.label,
          { "text-anchor": "middle", class: "zs-segment-label" });
      }
      x += width;
    }
    if (opts.caption) text(f.svg, f.margin.left, f.height - 4, opts.caption, { class: "zs-caption" });
    return f.svg;
  }

  window.ZsChart = {
    PALETTE: PALETTE,
    color: (i) => PALETTE[((i % PALETTE.length) + PALETTE.length) % PALETTE.length],
    formatBytes: formatBytes,
    formatNumber: defaultFormat,
    byteTicks: byteTicks,
    niceTicks: niceTicks,
    legend: legend,
    lineChart: lineChart,
    stackedBars: stackedBars,
    segmentedBar: segmentedBar,
  };
})();
