// fxtune dashboard: charts from the JSON blocks the server rendered, live job progress, and the
// upload and tune forms. No framework, no CDN. With FXTUNE_API_TOKEN set, the page reads the API
// with the HttpOnly session cookie the sign-in set (no script can read it); a form that writes
// sends the token typed into it, for that request only, and keeps it nowhere.
"use strict";

(() => {
  const POLL_MS = 1000;
  const TERMINAL = new Set(["succeeded", "failed"]);
  const PALETTE = ["#2f6fde", "#e8833a", "#2ca58d", "#c4321c", "#8e6bd1", "#b8a03a", "#5b6b82",
    "#d45b9a", "#3aa7c4", "#7a9e3a"];

  // Reads carry the session cookie (same origin); a write carries `token` when the form has one.
  function api(url, options = {}, token = "") {
    const headers = new Headers(options.headers || {});
    if (token) headers.set("Authorization", `Bearer ${token}`);
    return fetch(url, { ...options, headers, credentials: "same-origin" });
  }

  // The token field of a form that writes: its value for this one request, then emptied.
  function takeToken(form, fields) {
    const input = form.querySelector("input[name=api_token]");
    if (fields) fields.delete("api_token");
    if (!input) return "";
    const value = input.value.trim();
    input.value = "";
    return value;
  }

  async function detail(resp) {
    try {
      const body = await resp.json();
      return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    } catch {
      return resp.statusText;
    }
  }

  // --- Charts.
  function data(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function speedupChart() {
    const spec = data("speedup-data");
    const canvas = document.getElementById("speedup-chart");
    if (!spec || !canvas || !window.Chart) return;
    const datasets = spec.datasets.map((ds, i) => ({
      label: ds.label,
      data: ds.data,
      ci: ds.ci,
      verdict: ds.verdict,
      backgroundColor: PALETTE[i % PALETTE.length],
      borderRadius: 3,
      maxBarThickness: 90,
    }));
    new Chart(canvas, {
      type: "bar",
      data: { labels: spec.labels, datasets },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: {
          y: { beginAtZero: true, title: { display: true, text: "speedup (×)" } },
        },
        plugins: {
          tooltip: {
            callbacks: {
              label: (ctx) => {
                const ds = ctx.dataset;
                const v = ctx.parsed.y;
                return `${ds.label}: ${v.toFixed(2)}× ${ds.ci[ctx.dataIndex]} (${ds.verdict[ctx.dataIndex]})`;
              },
            },
          },
        },
      },
    });
  }

  function breakdownChart() {
    const spec = data("breakdown-data");
    const canvas = document.getElementById("breakdown-chart");
    if (!spec || !canvas || !window.Chart) return;
    const datasets = spec.datasets.map((ds, i) => ({
      label: ds.label,
      data: ds.data,
      backgroundColor: PALETTE[i % PALETTE.length],
      maxBarThickness: 48,
    }));
    new Chart(canvas, {
      type: "bar",
      data: { labels: spec.labels, datasets },
      options: {
        animation: false,
        indexAxis: "y",
        maintainAspectRatio: false,
        scales: {
          x: { stacked: true, title: { display: true, text: spec.unit } },
          y: { stacked: true },
        },
        plugins: {
          tooltip: {
            callbacks: {
              label: (ctx) => (ctx.parsed.x === null ? `${ctx.dataset.label}: n/a`
                : `${ctx.dataset.label}: ${ctx.parsed.x.toFixed(1)} µs`),
            },
          },
        },
      },
    });
  }

  // --- Jobs: poll every unfinished row until it ends.
  function cell(row, cls) { return row.querySelector(`.${cls}`); }

  function render(row, job) {
    row.dataset.status = job.status;
    const badge = cell(row, "status").querySelector(".badge");
    badge.className = `badge ${job.status}`;
    badge.textContent = job.status;
    row.querySelector("progress").value = job.progress;
    cell(row, "pct").textContent = `${Math.round(job.progress * 100)}%`;
    const message = cell(row, "message");
    message.textContent = "";
    if (job.error) {
      const span = document.createElement("span");
      span.className = "error";
      span.textContent = job.error;
      message.appendChild(span);
    } else {
      message.textContent = job.message || "";
    }
    if (job.status === "succeeded") {
      const link = document.createElement("a");
      const mode = job.mode === "train" ? "&mode=train" : "";
      link.href = `/models/${job.model_id}?device=${encodeURIComponent(job.device)}${mode}`;
      link.className = "results";
      link.textContent = " results →";
      message.appendChild(link);
    }
    cell(row, "attempts").textContent = job.attempts;
    cell(row, "updated").textContent = job.updated_at.replace("T", " ").slice(0, 19);
  }

  async function poll(row) {
    const id = row.dataset.jobId;
    while (!TERMINAL.has(row.dataset.status)) {
      await new Promise((r) => setTimeout(r, POLL_MS));
      let resp;
      try {
        resp = await api(`/api/v1/jobs/${id}`);
      } catch {
        continue; // the service restarting: keep trying
      }
      if (!resp.ok) {
        cell(row, "message").textContent = `cannot follow job: ${resp.status} ${await detail(resp)}`;
        return;
      }
      const job = await resp.json();
      render(row, job);
      if (job.status === "succeeded" && row.closest("table").hasAttribute("data-reload-on-success")) {
        location.reload();
      }
    }
  }

  function targetText(job) {
    if (job.mode !== "train") return job.device;
    return `${job.device} · training${job.optimizer ? ` (${job.optimizer})` : ""}`;
  }

  // A training job names its mode; an optimizer is sent only with one.
  function modeFields(fields) {
    const out = {};
    if (fields.get("mode") === "train") {
      out.mode = "train";
      if (fields.get("optimizer")) out.optimizer = fields.get("optimizer");
    }
    return out;
  }

  function newJobRow(job, modelName) {
    const row = document.createElement("tr");
    row.dataset.jobId = job.id;
    row.dataset.status = job.status;
    row.dataset.modelId = job.model_id;
    const cells = [`#${job.id}`, null, targetText(job), null, null, null, null, null];
    const classes = [null, null, null, "status", null, "message", "num attempts", "updated muted"];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      if (classes[i]) td.className = classes[i];
      if (text !== null) td.textContent = text;
      row.appendChild(td);
    });
    const link = document.createElement("a");
    link.href = `/models/${job.model_id}`;
    link.textContent = modelName;
    row.children[1].appendChild(link);
    const badge = document.createElement("span");
    row.children[3].appendChild(badge);
    badge.className = "badge";
    const progress = document.createElement("progress");
    progress.max = 1;
    const pct = document.createElement("span");
    pct.className = "pct";
    row.children[4].append(progress, " ", pct);
    render(row, job);
    return row;
  }

  function followNewJob(job, modelName) {
    const body = document.querySelector("#jobs-table tbody");
    if (!body) return;
    const existing = body.querySelector(`tr[data-job-id="${job.id}"]`);
    if (existing) return;
    body.querySelector("tr.empty")?.remove();
    const row = newJobRow(job, modelName);
    body.prepend(row);
    poll(row);
  }

  // --- Forms.
  function setupUpload() {
    const form = document.getElementById("upload-form");
    if (!form) return;
    const out = document.getElementById("upload-result");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const fields = new FormData(form);
      const token = takeToken(form, fields);
      for (const key of ["name", "budget_s", "optimizer"]) {
        if (!fields.get(key)) fields.delete(key);
      }
      if (fields.get("mode") !== "train") fields.delete("optimizer");
      out.className = "form-result";
      out.textContent = "uploading…";
      const button = form.querySelector("button");
      button.disabled = true;
      try {
        const resp = await api(form.action, { method: "POST", body: fields }, token);
        if (!resp.ok) {
          out.className = "form-result error";
          out.textContent = `upload refused (${resp.status}): ${await detail(resp)}`;
          return;
        }
        const model = await resp.json();
        const again = resp.status === 200 ? " (these bytes were uploaded before)" : "";
        out.textContent = `model #${model.id} ${model.name}${again}; job #${model.job.id} ${model.job.status}`;
        followNewJob(model.job, model.name);
      } catch (err) {
        out.className = "form-result error";
        out.textContent = `upload failed: ${err}`;
      } finally {
        button.disabled = false;
      }
    });
  }

  function setupTune() {
    const form = document.getElementById("tune-form");
    if (!form) return;
    const out = document.getElementById("tune-result");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const fields = new FormData(form);
      const token = takeToken(form, fields);
      const body = { device: fields.get("device"), ...modeFields(fields) };
      if (fields.get("budget_s")) body.budget_s = Number(fields.get("budget_s"));
      const resp = await api(`/api/v1/models/${form.dataset.modelId}/jobs`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      }, token);
      if (!resp.ok) {
        out.className = "form-result error";
        out.textContent = `refused (${resp.status}): ${await detail(resp)}`;
        return;
      }
      const job = await resp.json();
      out.className = "form-result";
      out.textContent = `job #${job.id} ${job.status}`;
      followNewJob(job, document.querySelector("h1").firstChild.textContent.trim());
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    speedupChart();
    breakdownChart();
    setupUpload();
    setupTune();
    document.querySelectorAll("tr[data-job-id]").forEach((row) => {
      if (!TERMINAL.has(row.dataset.status)) poll(row);
    });
  });
})();
