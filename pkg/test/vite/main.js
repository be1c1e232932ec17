import { init, version } from "hostlease";
init().then(() => { document.body.dataset.protocol = String(version()); });
