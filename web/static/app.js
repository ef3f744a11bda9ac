// tokengate dashboard script. It is the page's only script (the
// Content-Security-Policy forbids inline ones) and needs nothing else:
// it keeps the overview's and tenant pages' numbers live by polling
// /ui/overview.json and moving text and SVG attributes in place, asks before
// destructive forms, copies a new key, and swaps the address of a new key's
// page so that reloading it is a plain GET that no longer shows the secret.
(function () {
  'use strict';

  var body = document.body;

  var replace = body.getAttribute('data-replace-url');
  if (replace && window.history && history.replaceState) {
    history.replaceState(null, '', replace);
  }

  document.addEventListener('submit', function (ev) {
    var msg = ev.target.getAttribute && ev.target.getAttribute('data-confirm');
    if (msg && !window.confirm(msg)) {
      ev.preventDefault();
    }
  });

  document.addEventListener('click', function (ev) {
    var button = ev.target.closest && ev.target.closest('[data-copy]');
    if (!button) {
      return;
    }
    var el = document.getElementById(button.getAttribute('data-copy'));
    if (!el) {
      return;
    }
    var select = function () {
      var range = document.createRange();
      range.selectNodeContents(el);
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      button.textContent = 'Selected: press Ctrl+C';
    };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(el.textContent).then(function () {
        button.textContent = 'Copied';
      }, select);
    } else {
      select();
    }
  });

  var live = body.getAttribute('data-live');
  if (!live) {
    return;
  }
  var INTERVAL = 2000;
  var statusEl = document.getElementById('live-status');
  var stopped = false;
  var timer = null;
  var busy = false;

  function setStatus(state, text) {
    if (statusEl) {
      statusEl.setAttribute('data-state', state);
      statusEl.textContent = text;
    }
  }

  function setText(el, text) {
    if (el.textContent !== text) {
      el.textContent = text;
    }
  }

  function setStatusClass(el, status) {
    var kept = el.className.split(/\s+/).filter(function (c) {
      return c && c.indexOf('status-') !== 0;
    });
    kept.push('status-' + status);
    el.className = kept.join(' ');
  }

  function updateTenant(el, t) {
    setStatusClass(el, t.status);
    Object.keys(t.fields).forEach(function (k) {
      el.querySelectorAll('[data-field="' + k + '"]').forEach(function (f) {
        setText(f, t.fields[k]);
      });
    });
    Object.keys(t.titles || {}).forEach(function (k) {
      el.querySelectorAll('[data-title="' + k + '"]').forEach(function (f) {
        f.setAttribute('title', t.titles[k]);
      });
    });
    Object.keys(t.gauges).forEach(function (k) {
      var g = el.querySelector('[data-gauge="' + k + '"]');
      if (!g) {
        return;
      }
      g.setAttribute('class', 'gauge level-' + t.gauges[k].level);
      var fill = g.querySelector('.fill');
      if (fill) {
        fill.setAttribute('width', t.gauges[k].pct);
      }
    });
    Object.keys(t.sparks).forEach(function (k) {
      var s = el.querySelector('[data-spark="' + k + '"]');
      if (!s) {
        return;
      }
      var bars = s.querySelectorAll('.bar');
      t.sparks[k].forEach(function (b, i) {
        if (bars[i]) {
          bars[i].setAttribute('y', b.y);
          bars[i].setAttribute('height', b.h);
        }
      });
    });
  }

  // The windows table's rows, by tenant and window name: the gauge, its
  // used / limit text, the span's spend and the next reset.
  function updateWindows(windows) {
    var rows = {};
    document.querySelectorAll('tr[data-window-tenant]').forEach(function (tr) {
      rows[tr.getAttribute('data-window-tenant') + '\n' + tr.getAttribute('data-window')] = tr;
    });
    windows.forEach(function (w) {
      var tr = rows[w.tenant + '\n' + w.name];
      if (!tr) {
        return;
      }
      var g = tr.querySelector('[data-gauge]');
      if (g) {
        g.setAttribute('class', 'gauge level-' + w.level);
        var fill = g.querySelector('.fill');
        if (fill) {
          fill.setAttribute('width', w.pct);
        }
      }
      var used = tr.querySelector('[data-col="used"] .gt');
      if (used) {
        setText(used, w.used);
      }
      var spent = tr.querySelector('[data-col="spent"]');
      if (spent) {
        setText(spent, w.spent);
      }
      var t = tr.querySelector('[data-col="resets"] time');
      if (t) {
        setText(t, w.resets);
        t.setAttribute('datetime', w.resets_at);
      }
    });
  }

  // A tenant may show more than once (its page, and its row in its tree).
  function update(data) {
    var els = {};
    document.querySelectorAll('[data-tenant]').forEach(function (el) {
      var id = el.getAttribute('data-tenant');
      (els[id] = els[id] || []).push(el);
    });
    var throttled = 0;
    var unknown = 0;
    data.tenants.forEach(function (t) {
      if (t.status === 'throttled') {
        throttled++;
      }
      if (els[t.id]) {
        els[t.id].forEach(function (el) { updateTenant(el, t); });
      } else {
        unknown++;
      }
    });

    // Keep the server's order: each tenant under its parent, throttled
    // trees first.
    var tbody = document.querySelector('[data-live-sort]');
    if (tbody) {
      var want = data.tenants.map(function (t) {
        return (els[t.id] || []).filter(function (el) { return el.parentNode === tbody; })[0];
      }).filter(function (el) {
        return el;
      });
      var have = Array.prototype.filter.call(tbody.children, function (el) { return el.hasAttribute('data-tenant'); });
      var same = want.length === have.length && want.every(function (el, i) { return el === have[i]; });
      if (!same) {
        want.forEach(function (el) { tbody.appendChild(el); });
      }
    }
    updateWindows(data.windows || []);
    var summary = document.querySelector('[data-summary="throttled"]');
    if (summary) {
      setText(summary, String(throttled));
      summary.classList.toggle('hot', throttled > 0);
    }
    var fresh = document.getElementById('new-tenants');
    if (fresh) {
      fresh.hidden = unknown === 0;
    }
  }

  function clock(at) {
    var d = new Date(at);
    return isNaN(d) ? '' : d.toISOString().slice(11, 19) + ' UTC';
  }

  function poll() {
    timer = null;
    if (stopped || busy) {
      return;
    }
    busy = true;
    fetch(live, { credentials: 'same-origin', cache: 'no-store', headers: { Accept: 'application/json' } })
      .then(function (r) {
        if (r.status === 401) {
          stopped = true;
          setStatus('ended', 'session ended: log in again');
          return null;
        }
        if (!r.ok) {
          throw new Error('HTTP ' + r.status);
        }
        return r.json();
      })
      .then(function (data) {
        if (data) {
          update(data);
          setStatus('ok', 'live · ' + clock(data.at));
        }
      })
      .catch(function () {
        setStatus('error', 'live updates failing, retrying');
      })
      .then(function () {
        busy = false;
        if (!stopped && !document.hidden) {
          timer = setTimeout(poll, INTERVAL);
        }
      });
  }

  // Hidden tabs stop polling; a tab shown again refreshes at once.
  document.addEventListener('visibilitychange', function () {
    if (!document.hidden && !stopped && timer === null) {
      poll();
    }
  });

  setStatus('ok', 'live');
  timer = setTimeout(poll, INTERVAL);
})();
