// demoforge view: the episode viewer page. Hand-written, no dependencies, no build step.
// Data arrives as scripts calling DemoforgeViewer.receive(name, payload) (a page opened from disk may load
// scripts but not fetch files). Episode time t (seconds from the episode's first frame) is the one clock:
// camera i shows it at videos[i].from_s + t (LeRobot concatenates episodes into one mp4 per file).
"use strict";

(() => {
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf"];
  const SEEK_EPS = 1e-4; // land just after a frame's start so rounding never shows the frame before
  const $ = (id) => document.getElementById(id);

  const state = {
    source: null, episodes: [], key: null, view: null, fps: 25, length: 0, frame: 0,
    segments: [], videos: [], playing: false, clockOrigin: 0, drawnFrame: -1, colors: new Map(),
    rejected: new Set(), rejectWritable: false, rejectFile: null,
  };
  const waiting = new Map();

  window.DemoforgeViewer = {
    receive(name, payload) {
      const resolve = waiting.get(name);
      waiting.delete(name);
      if (resolve) resolve(payload);
    },
    state,
    seekFrame: (f) => seekFrame(f),
  };

  function load(name) {
    return new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = `data/${encodeURIComponent(name)}.js`;
      waiting.set(name, (payload) => { script.remove(); resolve(payload); });
      script.onerror = () => { waiting.delete(name); script.remove(); reject(new Error(`cannot load ${name}`)); };
      document.head.appendChild(script);
    });
  }

  function el(tag, props = {}, children = []) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else if (k === "style") Object.assign(node.style, v);
      else node[k] = v;
    }
    for (const child of children) node.append(child);
    return node;
  }

  const baseName = (name) => { const m = /^(.*)_\d+$/.exec(name); return m ? m[1] : name; };
  function colorOf(name) {
    const base = baseName(name);
    if (!state.colors.has(base)) state.colors.set(base, PALETTE[state.colors.size % PALETTE.length]);
    return state.colors.get(base);
  }
  const fmt = (v) => (v === null || v === undefined ? "–" : String(v));

  // ------------------------------------------------------------------------------------ episode list
  function renderIndex() {
    const src = state.source;
    const version = src.version ? ` · version ${src.version}` : "";
    $("source-line").textContent = `${src.kind}: ${src.name}${src.task ? " · " + src.task : ""}${version} · ` +
      `${src.fps} fps · cameras: ${src.cameras.join(", ") || "none"}` + (src.notes.length ? ` · ${src.notes.join("; ")}` : "");
    document.title = `demoforge view · ${src.name}`;
    const counts = new Map();
    const names = new Set();
    for (const e of state.episodes) {
      counts.set(e.outcome, (counts.get(e.outcome) || 0) + 1);
      e.segments.forEach((n) => { names.add(n); colorOf(n); });
    }
    const select = $("filter-outcome");
    for (const [outcome, n] of counts) select.append(el("option", { value: outcome, textContent: `${outcome} (${n})` }));
    const chips = $("outcome-counts");
    for (const [outcome, n] of counts) {
      chips.append(el("button", { type: "button", className: "chip", textContent: `${outcome}: ${n}`,
        dataset: { outcome }, onclick: () => { select.value = select.value === outcome ? "" : outcome; renderList(); } }));
    }
    for (const n of names) $("segment-names").append(el("option", { value: n }));
    select.onchange = renderList;
    $("filter-segment").oninput = renderList;
    renderList();
  }

  function visibleEpisodes() {
    const outcome = $("filter-outcome").value;
    const seg = $("filter-segment").value.trim();
    return state.episodes.filter((e) => (!outcome || e.outcome === outcome) &&
      (!seg || e.segments.some((n) => n === seg || baseName(n) === seg || n.includes(seg))));
  }

  function renderList() {
    const rows = visibleEpisodes();
    const outcome = $("filter-outcome").value;
    for (const chip of $("outcome-counts").children) chip.classList.toggle("active", chip.dataset.outcome === outcome);
    $("episode-count").textContent = `${rows.length} of ${state.episodes.length} ${state.source.kind === "store" ? "attempts" : "episodes"}`;
    const body = $("episodes").tBodies[0];
    body.replaceChildren(...rows.map((e) => {
      const tr = el("tr", { dataset: { key: e.key }, onclick: () => { location.hash = "episode=" + encodeURIComponent(e.key); } }, [
        el("td", { textContent: fmt(e.dataset_index) }),
        el("td", { textContent: fmt(e.episode_index) }),
        el("td", { textContent: fmt(e.length) }),
        el("td", { textContent: e.outcome, title: e.reason || "", className: e.outcome === "success" ? "outcome-success" : "outcome-other" }),
        el("td", { textContent: fmt(e.seed) }),
        el("td", { textContent: fmt(e.attempt) }),
        el("td", { textContent: String(e.segments.length), title: e.segments.join(", ") }),
        el("td", { textContent: state.rejected.has(e.key) ? "rejected" : "", className: "review" }),
      ]);
      tr.classList.toggle("rejected", state.rejected.has(e.key));
      tr.classList.toggle("selected", e.key === state.key);
      tr.classList.toggle("unplayable", !e.playable);
      return tr;
    }));
  }

  // ------------------------------------------------------------------------------------ rejecting
  // A dataset's rejected list lives in a file beside it (never inside); the server changes it on POST. A static
  // folder shows the list as it was written and cannot change it.
  function applyRejected(payload) {
    state.rejected = new Set(payload.keys);
    state.rejectWritable = payload.writable;
    state.rejectFile = payload.file;
    const line = $("rejected-line");
    line.hidden = state.source.kind !== "dataset";
    line.textContent = `${state.rejected.size} rejected` + (payload.file ? ` (listed in ${payload.file}; ` +
      "`demoforge edit DATASET --delete-rejected` deletes them)" : "");
    renderList();
    renderRejectButton();
  }

  function renderRejectButton() {
    const button = $("reject");
    button.hidden = !state.view || state.source.kind !== "dataset";
    const marked = state.rejected.has(state.key);
    button.textContent = marked ? "un-reject" : "reject";
    button.classList.toggle("active", marked);
    button.disabled = !state.rejectWritable;
    if (!state.rejectWritable) button.title = "marking needs `demoforge view DATASET` (a static folder is read-only)";
  }

  async function toggleRejected() {
    if (!state.rejectWritable || state.key === null) return;
    const response = await fetch("api/rejected", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ key: state.key, rejected: !state.rejected.has(state.key) }) });
    if (!response.ok) {
      $("notice").hidden = false;
      $("notice").append(el("div", { textContent: `could not change the rejected list (${response.status})` }));
      return;
    }
    applyRejected({ ...(await response.json()), writable: true, file: state.rejectFile });
  }

  // --------------------------------------------------------------------------------------- episode
  async function openEpisode(key) {
    if (key === state.key) return;
    pause();
    let view;
    try {
      view = await load(`episode-${key}`);
    } catch (err) {
      $("notice").hidden = false;
      $("notice").textContent = String(err);
      return;
    }
    state.key = key;
    state.view = view;
    state.segments = (view.record.segments || []).map((s) => ({ ...s, start: s.start_step, end: s.end_step }));
    state.length = view.entry.length || (state.segments.length ? state.segments[state.segments.length - 1].end : 0);
    state.frame = 0;
    state.drawnFrame = -1;
    for (const tr of $("episodes").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.key === key);
    $("empty").hidden = true;
    $("episode").hidden = false;
    const e = view.entry;
    $("episode-title").textContent = state.source.kind === "store"
      ? `attempt ${e.key} · episode ${fmt(e.episode_index)} attempt ${fmt(e.attempt)} · ${e.state} · ${e.outcome}`
      : `episode ${e.dataset_index} · ${e.length} frames · ${e.outcome}`;
    renderNotice(view);
    renderVideos(view);
    renderTimeline();
    renderCurves(view);
    renderSegmentTable();
    renderRejectButton();
    seekFrame(0);
  }

  function renderNotice(view) {
    const e = view.entry, r = view.record;
    const lines = [];
    if (!e.playable) lines.push(`no frames to show: ${e.state === "discarded" ? "a discarded attempt's frames are deleted when it is discarded" : `the attempt is ${e.state}`}.`);
    if (e.reason) lines.push(`${e.state} because: ${e.reason}`);
    if (r.failure_reason && r.failure_reason !== e.reason) lines.push(`failure: ${r.failure_reason}`);
    if (r.instruction) lines.push(`instruction: ${r.instruction}`);
    if (r.driver) lines.push(`driven by: ${r.driver}${r.interventions ? `, ${r.interventions} expert takeover(s)` : ""}`);
    if (r.randomization) {
      const { axes, variant, ...drawn } = r.randomization;
      const short = JSON.stringify(drawn, (_k, v) => (typeof v === "number" ? Number(v.toFixed(3)) : v));
      lines.push(`randomized: ${(axes || []).join(", ") || "nothing"}${variant ? ` (variant ${variant})` : ""}; drawn: ${short}`);
    }
    if (r.seed !== undefined && state.source.kind === "dataset") lines.push(`job episode ${r.episode_index}, attempt ${r.attempt}, seed ${r.seed}`);
    $("notice").hidden = lines.length === 0;
    $("notice").replaceChildren(...lines.map((t) => el("div", { textContent: t })));
    const error = [r.error_type, r.error].filter(Boolean).join(": ");
    $("error-box").hidden = !error;
    $("error-text").textContent = error;
  }

  function renderVideos(view) {
    state.videos = view.videos.map((v) => {
      const video = el("video", { muted: true, playsInline: true, preload: "auto", src: v.url });
      video.dataset.camera = v.camera;
      video.dataset.from = String(v.from_s);
      video.dataset.kind = v.kind;
      video.addEventListener("loadedmetadata", () => { if (!state.playing) placeVideos(); });
      video.addEventListener("seeked", () => { if (!state.playing) updateUi(); });
      video.addEventListener("error", () => {
        $("notice").hidden = false;
        $("notice").append(el("div", { textContent: `camera ${v.camera}: the browser cannot play ${v.url} (${video.error && video.error.message || "error"}); Chromium plays AV1 and h264, not HEVC` }));
      });
      return { ...v, video };
    });
    if (state.videos.length) { // animation frames stop in a hidden tab; the end of the episode must not
      state.videos[0].video.addEventListener("timeupdate", () => { if (state.playing && atEnd()) stopAtEnd(); });
    }
    $("videos").replaceChildren(...state.videos.map((v) => el("figure", {}, [v.video, el("figcaption", { textContent: cameraLabel(v) })])));
  }

  // a depth preview's colours run from yellow (near_m and nearer) to dark blue (far_m and farther)
  const cameraLabel = (v) => (v.kind === "depth" ? `${v.camera} · depth ${v.near_m.toFixed(2)}–${v.far_m.toFixed(2)} m` : v.camera);

  // -------------------------------------------------------------------------------------- the clock
  const duration = () => state.length / state.fps;

  function episodeTime() {
    if (state.videos.length) {
      const p = state.videos[0];
      return p.video.currentTime - p.from_s;
    }
    return state.playing ? (performance.now() - state.clockOrigin) / 1000 : state.frame / state.fps;
  }

  const frameAt = (t) => Math.max(0, Math.min(state.length - 1, Math.floor(t * state.fps + 0.01)));

  function placeVideos() {
    const t = state.frame / state.fps + SEEK_EPS;
    for (const v of state.videos) v.video.currentTime = v.from_s + t;
  }

  function seekFrame(frame) {
    if (!state.view) return;
    pause();
    state.frame = Math.max(0, Math.min(Math.max(state.length - 1, 0), frame));
    placeVideos();
    updateUi();
  }

  function play() {
    if (!state.view || state.playing || state.length === 0) return;
    if (state.frame >= state.length - 1) seekFrame(0);
    state.playing = true;
    state.clockOrigin = performance.now() - (state.frame / state.fps) * 1000;
    for (const v of state.videos) v.video.play().catch(() => {});
    $("play").textContent = "pause";
    requestAnimationFrame(tick);
  }

  function pause() {
    if (!state.playing) return;
    state.playing = false;
    for (const v of state.videos) v.video.pause();
    state.frame = frameAt(episodeTime());
    placeVideos();
    $("play").textContent = "play";
    updateUi();
  }

  const atEnd = () => episodeTime() >= duration() - 0.5 / state.fps;
  function stopAtEnd() { // the file may hold the next episode: stop on this one's last frame
    pause();
    seekFrame(state.length - 1);
  }

  function tick() {
    if (!state.playing) return;
    const t = episodeTime();
    if (atEnd()) return stopAtEnd();
    state.frame = frameAt(t);
    for (const v of state.videos.slice(1)) { // keep the other cameras on the first one's clock
      if (Math.abs(v.video.currentTime - v.from_s - t) > 1.5 / state.fps) v.video.currentTime = v.from_s + t;
    }
    updateUi();
    requestAnimationFrame(tick);
  }

  // --------------------------------------------------------------------------------------- drawing
  function segmentIndexAt(frame) {
    return state.segments.findIndex((s) => s.start <= frame && frame < s.end);
  }

  function updateUi() {
    if (!state.playing && state.videos.length) state.frame = frameAt(episodeTime());
    const frame = state.frame;
    const total = Math.max(state.length, 1);
    $("clock").textContent = `frame ${frame} / ${state.length - 1} · ${(frame / state.fps).toFixed(2)} s`;
    $("playhead").style.left = `${(100 * (frame + 0.5)) / total}%`;
    const current = segmentIndexAt(frame);
    for (const span of $("timeline").querySelectorAll(".seg")) span.classList.toggle("current", Number(span.dataset.index) === current);
    for (const tr of $("segments").tBodies[0].rows) {
      const now = Number(tr.dataset.index) === current;
      if (now && !tr.classList.contains("current")) scrollWithin($("segment-panel").querySelector(".scroll"), tr);
      tr.classList.toggle("current", now);
    }
    $("current-segment").textContent = current >= 0 ? state.segments[current].name : "";
    $("current-segment").dataset.index = String(current);
    if (frame !== state.drawnFrame) {
      state.drawnFrame = frame;
      drawCurves();
    }
  }

  function scrollWithin(box, row) { // keep the current row in view without scrolling the page
    if (row.offsetTop < box.scrollTop + row.offsetHeight) box.scrollTop = Math.max(row.offsetTop - row.offsetHeight, 0);
    else if (row.offsetTop + row.offsetHeight > box.scrollTop + box.clientHeight) box.scrollTop = row.offsetTop + row.offsetHeight - box.clientHeight;
  }

  function renderTimeline() {
    const total = Math.max(state.length, 1);
    const spans = state.segments.map((s, i) => {
      const span = el("div", {
        className: "seg" + (s.success === false ? " failed" : ""), textContent: s.name,
        title: `${s.name} [${s.start}, ${s.end})${s.instruction ? " · " + s.instruction : ""}`,
        dataset: { index: String(i), name: s.name, start: String(s.start) },
        style: { left: `${(100 * s.start) / total}%`, width: `${(100 * (s.end - s.start)) / total}%`, background: colorOf(s.name) },
      });
      span.addEventListener("click", (ev) => { ev.stopPropagation(); seekFrame(s.start); });
      return span;
    });
    $("timeline").replaceChildren(...spans, $("playhead"));
  }

  $("timeline").addEventListener("click", (ev) => {
    const box = $("timeline").getBoundingClientRect();
    seekFrame(Math.floor(((ev.clientX - box.left) / box.width) * state.length));
  });

  function renderSegmentTable() {
    const rows = state.segments.map((s, i) => el("tr", { dataset: { index: String(i) }, onclick: () => seekFrame(s.start) }, [
      el("td", { textContent: String(s.segment_id ?? i) }),
      el("td", {}, [el("span", { className: "swatch", style: { background: colorOf(s.name) } }), s.name]),
      el("td", { textContent: fmt(s.instruction) }),
      el("td", { textContent: fmt(s.target) }),
      el("td", {}, [`[${s.start}, ${s.end}) · ${s.end - s.start}`, el("br"),
        el("small", { textContent: `${(s.start / state.fps).toFixed(2)}–${(s.end / state.fps).toFixed(2)} s` })]),
      el("td", { textContent: s.success ? "ok" : `failed${s.failure_reason ? ": " + s.failure_reason : ""}`, className: s.success ? "" : "fail" }),
      el("td", { className: "meta", title: JSON.stringify(s.metadata || {}, null, 1) }, [el("code", { textContent: metadataText(s.metadata) })]),
    ]));
    $("segments").tBodies[0].replaceChildren(...rows);
  }

  function shortValue(v) {
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(3);
    if (Array.isArray(v)) return `[${v.map(shortValue).join(", ")}]`;
    if (v && typeof v === "object") return "{…}";
    return String(v);
  }
  function metadataText(meta) {
    const entries = Object.entries(meta || {});
    return entries.length ? entries.map(([k, v]) => `${k}=${shortValue(v)}`).join("  ") : "–";
  }

  function renderCurves(view) {
    const figures = view.curves.map((c) => {
      const canvas = el("canvas");
      canvas.dataset.curve = c.name;
      canvas.addEventListener("click", (ev) => {
        const box = canvas.getBoundingClientRect();
        seekFrame(Math.round(((ev.clientX - box.left) / box.width) * (state.length - 1)));
      });
      const dims = c.values.length ? c.values[0].length : 0;
      return el("figure", {}, [el("figcaption", { textContent: `${c.name} (${dims} dim${dims === 1 ? "" : "s"})` }), canvas]);
    });
    $("curves").replaceChildren(...figures);
    state.drawnFrame = -1;
  }

  function drawCurves() {
    if (!state.view) return;
    const canvases = $("curves").querySelectorAll("canvas");
    state.view.curves.forEach((curve, i) => drawCurve(canvases[i], curve.values));
  }

  function drawCurve(canvas, values) {
    const ratio = window.devicePixelRatio || 1;
    const w = Math.max(canvas.clientWidth, 100), h = Math.max(canvas.clientHeight, 60);
    if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, w, h);
    const n = values.length;
    if (!n) return;
    const pad = { l: 44, r: 6, t: 6, b: 6 };
    const x = (f) => pad.l + ((w - pad.l - pad.r) * f) / Math.max(n - 1, 1);
    let lo = Infinity, hi = -Infinity;
    for (const row of values) for (const v of row) if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (hi - lo < 1e-9) { hi += 0.5; lo -= 0.5; }
    const y = (v) => pad.t + (h - pad.t - pad.b) * (1 - (v - lo) / (hi - lo));
    state.segments.forEach((s) => { // segment bands, then boundary lines
      g.fillStyle = colorOf(s.name) + "22";
      g.fillRect(x(s.start), pad.t, x(Math.min(s.end, n - 1)) - x(s.start), h - pad.t - pad.b);
    });
    g.strokeStyle = "#00000055";
    g.setLineDash([3, 3]);
    g.lineWidth = 1;
    for (const s of state.segments) { g.beginPath(); g.moveTo(x(s.start) + 0.5, pad.t); g.lineTo(x(s.start) + 0.5, h - pad.b); g.stroke(); }
    g.setLineDash([]);
    const dims = values[0].length;
    for (let d = 0; d < dims; d++) {
      g.strokeStyle = dims <= PALETTE.length ? PALETTE[d] : `hsl(${(d * 360) / dims}, 65%, 45%)`;
      g.lineWidth = dims > 8 ? 1 : 1.5;
      g.beginPath();
      let pen = false;
      for (let f = 0; f < n; f++) {
        const v = values[f][d];
        if (v === null) { pen = false; continue; }
        if (pen) g.lineTo(x(f), y(v)); else g.moveTo(x(f), y(v));
        pen = true;
      }
      g.stroke();
    }
    g.fillStyle = "#6b6b70";
    g.font = "10px system-ui, sans-serif";
    g.fillText(hi.toPrecision(3), 2, pad.t + 8);
    g.fillText(lo.toPrecision(3), 2, h - pad.b);
    g.strokeStyle = "#111";
    g.lineWidth = 1.5;
    const px = x(state.frame);
    g.beginPath(); g.moveTo(px, 0); g.lineTo(px, h); g.stroke();
  }

  // -------------------------------------------------------------------------------------- keyboard
  document.addEventListener("keydown", (ev) => {
    if (!state.view || ev.target.closest("input, select, textarea") || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const current = segmentIndexAt(state.frame);
    if (ev.key === " ") state.playing ? pause() : play();
    else if (ev.key === "ArrowRight") seekFrame(state.frame + 1);
    else if (ev.key === "ArrowLeft") seekFrame(state.frame - 1);
    else if (ev.key === "]" && current + 1 < state.segments.length) seekFrame(state.segments[current + 1].start);
    else if (ev.key === "[" && state.segments.length) { // like "previous chapter": this segment's start, then the one before
      const here = current >= 0 && state.frame > state.segments[current].start;
      seekFrame(state.segments[here ? current : Math.max(current - 1, 0)].start);
    }
    else return;
    ev.preventDefault();
  });
  $("reject").addEventListener("click", (ev) => { ev.currentTarget.blur(); toggleRejected(); });
  $("play").addEventListener("click", (ev) => {
    ev.currentTarget.blur(); // a focused button would also take the space key: keep one toggle per press
    state.playing ? pause() : play();
  });
  window.addEventListener("resize", () => { state.drawnFrame = -1; drawCurves(); });

  function route() {
    const m = /episode=([^&]+)/.exec(location.hash);
    if (m) openEpisode(decodeURIComponent(m[1]));
  }
  window.addEventListener("hashchange", route);

  load("index").then((index) => {
    state.source = index.source;
    state.fps = index.source.fps;
    state.episodes = index.episodes;
    renderIndex();
    route();
    return load("rejected").then(applyRejected);
  }).catch((err) => { $("source-line").textContent = String(err); });
})();
