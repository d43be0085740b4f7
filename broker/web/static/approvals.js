"use strict";
// Calls the broker's REST API with the approver's bearer token. Every value from the server
// is placed with textContent: a report's content is data, never markup.
(function () {
  const $ = (id) => document.getElementById(id);
  const status = (text) => { $("status").textContent = text; };
  const token = () => $("token").value.trim();

  async function api(path, method) {
    const response = await fetch(path, {
      method: method || "GET",
      headers: { "Authorization": "Bearer " + token() },
      cache: "no-store",
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) { throw new Error(body.error || ("HTTP " + response.status)); }
    return body;
  }

  async function decide(id, verb, card) {
    try {
      const record = await api("/v1/approvals/" + encodeURIComponent(id) + "/" + verb, "POST");
      card.querySelector(".state").textContent = record.state;
      card.querySelectorAll("button").forEach((b) => { b.disabled = true; });
      status("Recorded: " + record.state);
    } catch (err) { status("Not recorded: " + err.message); }
  }

  async function load() {
    status("Loading…");
    const list = $("list");
    list.replaceChildren();
    try {
      const wanted = new URLSearchParams(location.search).get("id");
      const { approvals } = await api("/v1/approvals?state=pending");
      const shown = wanted ? approvals.filter((a) => a.approval_id === wanted) : approvals;
      for (const item of shown) {
        const detail = await api("/v1/approvals/" + encodeURIComponent(item.approval_id));
        const card = $("card").content.firstElementChild.cloneNode(true);
        card.querySelector(".filename").textContent = detail.filename;
        card.querySelector(".requester").textContent = detail.requester;
        card.querySelector(".bytes").textContent = detail.bytes + " bytes";
        card.querySelector(".sha256").textContent = detail.sha256;
        card.querySelector(".state").textContent = detail.state;
        card.querySelector(".content").textContent = detail.content;
        card.querySelector(".approve").addEventListener("click", () => decide(detail.approval_id, "approve", card));
        card.querySelector(".deny").addEventListener("click", () => decide(detail.approval_id, "deny", card));
        list.appendChild(card);
      }
      status(shown.length ? shown.length + " pending" : "Nothing is waiting for approval.");
    } catch (err) { status("Could not load: " + err.message); }
  }

  document.addEventListener("DOMContentLoaded", () => { $("load").addEventListener("click", load); });
})();
