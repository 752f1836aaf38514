// The queue page's timer (see app.js): browsers throttle a hidden tab's own
// timers (down to one wake-up a minute), not a dedicated worker's, so the
// page keeps polling at the pace the edge advises while in the background.
// Message in: {id, ms}; message out after ms: id.
'use strict';
onmessage = (e) => {
  const { id, ms } = e.data || {};
  if (Number.isFinite(id) && Number.isFinite(ms)) setTimeout(() => postMessage(id), Math.max(0, ms));
};
