#!/usr/bin/env python3
"""The image's HEALTHCHECK: exit 0 when the Kernel in this container is ready, 1 otherwise.

It asks, in order, the first endpoint that this container's mode serves:
  KERNEL_HEALTHCHECK_URL                  when set, only that URL
  http://127.0.0.1:8000/v2/health/ready   `kernel serve` (KServe v2 HTTP endpoint)
  AIP_HTTP_PORT + AIP_HEALTH_ROUTE        Vertex AI (AIP_MODE=PREDICTION turns HTTP off)
  SAGEMAKER_BIND_TO_PORT (8080) + /ping   SageMaker's `serve` (HTTP off as well)
An endpoint that refuses the connection is skipped; the first that answers decides: 200 is healthy.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def candidates(env) -> list[str]:
    if env.get("KERNEL_HEALTHCHECK_URL"):
        return [env["KERNEL_HEALTHCHECK_URL"]]
    urls = ["http://127.0.0.1:8000/v2/health/ready"]
    if env.get("AIP_MODE") == "PREDICTION" and env.get("AIP_HEALTH_ROUTE"):
        urls.append(f"http://127.0.0.1:{env.get('AIP_HTTP_PORT', '8080')}{env['AIP_HEALTH_ROUTE']}")
    urls.append(f"http://127.0.0.1:{env.get('SAGEMAKER_BIND_TO_PORT', '8080')}/ping")
    return urls


def main() -> int:
    for url in candidates(os.environ):
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                print(f"{url}: {r.status}")
                return 0 if r.status == 200 else 1
        except urllib.error.HTTPError as e:
            print(f"{url}: {e.code}")
            return 1
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, ConnectionRefusedError):
                continue
            print(f"{url}: {reason}")
            return 1
    print("no Kernel endpoint is listening")
    return 1


if __name__ == "__main__":
    sys.exit(main())
