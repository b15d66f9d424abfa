// Progressive enhancement only: every page works without this file.
(function () {
  "use strict";

  // Onboarding: pre-select the browser's time zone; the participant still confirms it.
  var zoneSelect = document.querySelector("[data-detect-timezone]");
  if (zoneSelect && !zoneSelect.value) {
    try {
      var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
      if (zone && zoneSelect.querySelector('option[value="' + zone + '"]')) {
        zoneSelect.value = zone;
        var note = document.querySelector("[data-tz-detected]");
        if (note) { note.hidden = false; }
      }
    } catch (e) { /* keep the manual choice */ }
  }

  function csrfOf(form) {
    var field = form.querySelector('input[name="csrf"]');
    return field ? field.value : "";
  }

  // Surveys: save each answer as it is given (the step buttons save too).
  var survey = document.querySelector("form[data-autosave]");
  if (survey) {
    var status = survey.querySelector("[data-save-status]");
    survey.addEventListener("change", function (event) {
      var field = event.target;
      if (!field.name || field.name === "csrf" || field.name === "step" || field.name === "submission_id") { return; }
      var answers = {};
      if (field.type === "checkbox") {
        answers[field.name] = Array.prototype.map.call(
          survey.querySelectorAll('input[name="' + field.name + '"]:checked'), function (box) { return box.value; });
      } else {
        var number = Number(field.value);
        answers[field.name] = field.value === "" ? null : (field.type === "radio" || field.type === "number") &&
          !isNaN(number) ? number : field.value;
      }
      fetch(survey.getAttribute("data-autosave"), {
        method: "PUT", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "X-CSRF-Token": csrfOf(survey)},
        body: JSON.stringify({answers: answers})
      }).then(function (response) {
        if (status) { status.textContent = response.ok ? "Saved." : "Not saved yet; it will be saved when you go on."; }
      }).catch(function () {
        if (status) { status.textContent = "Offline: your answers will be saved when you go on."; }
      });
    });
  }

  // Chat: a draft typed while a reply is written outlives the page being shown again (kept in this
  // tab's sessionStorage for this conversation, put back in the empty message box, then forgotten).
  var composer = document.querySelector("form[data-stream]");
  var box = composer ? composer.querySelector("textarea") : null;
  var draftKey = "afterward-draft:" + window.location.pathname;
  function keepDraft() {
    try {
      if (box && box.value.trim()) { window.sessionStorage.setItem(draftKey, box.value); }
    } catch (e) { /* storage refused: the draft stays only in the box */ }
  }
  if (box) {
    try {
      var kept = window.sessionStorage.getItem(draftKey);
      window.sessionStorage.removeItem(draftKey);
      if (kept && !box.value) { box.value = kept; }
    } catch (e) { /* storage refused */ }
  }
  function showLatest() {
    keepDraft();
    window.location.assign(window.location.pathname + "#latest");
    window.location.reload();
  }

  // Chat: stream the reply as it is written, then show the page with the stored turn. The box is
  // emptied once the message is on its way, so what is typed meanwhile is the next draft.
  if (composer && window.fetch && window.TextDecoder) {
    composer.addEventListener("submit", function (event) {
      var text = box.value.trim();
      if (!text) { return; }
      event.preventDefault();
      box.value = "";
      var button = composer.querySelector('button[type="submit"]');
      button.disabled = true;
      var list = document.querySelector("[data-messages]");
      var mine = document.createElement("li");
      mine.className = "msg participant";
      mine.innerHTML = '<p class="who">You</p><div class="bubble"></div>';
      mine.querySelector(".bubble").textContent = text;
      var reply = document.createElement("li");
      reply.className = "msg assistant";
      reply.innerHTML = '<p class="who">Assistant</p><div class="bubble" aria-live="polite"></div>';
      list.appendChild(mine);
      list.appendChild(reply);
      var bubble = reply.querySelector(".bubble");
      var id = "m" + Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
      fetch(composer.getAttribute("data-stream"), {
        method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "X-CSRF-Token": csrfOf(composer), "Accept": "text/event-stream"},
        body: JSON.stringify({content: text, client_message_id: id})
      }).then(function (response) {
        if (!response.ok || !response.body) { throw new Error("status " + response.status); }
        var reader = response.body.getReader();
        var decoder = new TextDecoder();
        var buffer = "";
        function pump() {
          return reader.read().then(function (chunk) {
            if (chunk.done) { return; }
            buffer += decoder.decode(chunk.value, {stream: true});
            var events = buffer.split("\n\n");
            buffer = events.pop();
            events.forEach(function (block) {
              var name = (block.match(/^event: (.*)$/m) || [])[1];
              var data = (block.match(/^data: (.*)$/m) || [])[1];
              if (name === "delta" && data) { bubble.textContent += JSON.parse(data).text; }
            });
            return pump();
          });
        }
        return pump();
      }).then(showLatest).catch(function () {
        // Fall back to the plain form, as the same message: one already saved is not saved twice.
        keepDraft();
        box.value = text;
        var mid = composer.querySelector('input[name="mid"]');
        if (!mid) {
          mid = document.createElement("input");
          mid.type = "hidden";
          mid.name = "mid";
          composer.appendChild(mid);
        }
        mid.value = id;
        composer.submit();
      });
    });
  }

  // Chat: a reply still being written when the page loaded (the participant came back while it
  // was): show the page again once it is stored. Asks for a few minutes at most.
  var awaiting = document.querySelector("[data-awaiting-reply]");
  if (awaiting && window.fetch) {
    var asked = 0;
    var ask = function () {
      asked += 1;
      fetch(awaiting.getAttribute("data-awaiting-reply"), {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (conversation) {
          if (conversation && !conversation.awaiting_reply) {
            showLatest();
          } else if (asked < 150) {
            window.setTimeout(ask, 1200);
          }
        })
        .catch(function () { if (asked < 150) { window.setTimeout(ask, 3000); } });
    };
    window.setTimeout(ask, 800);
  }
})();
