// The Portkey gateway on 127.0.0.1 only: its start-server passes no hostname to @hono/node-server,
// which then listens on every interface. `node loopback.mjs GATEWAY_START_SERVER_JS --port=N`.
import net from "node:net";
import { pathToFileURL } from "node:url";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (port, hostname, ...rest) {
  if (typeof port === "number" && (hostname === undefined || typeof hostname === "function")) {
    return listen.call(this, port, "127.0.0.1", ...(hostname === undefined ? rest : [hostname, ...rest]));
  }
  return listen.call(this, port, hostname, ...rest);
};
const [script, ...args] = process.argv.slice(2);
process.argv = [process.argv[0], script, ...args];
await import(pathToFileURL(script).href);
