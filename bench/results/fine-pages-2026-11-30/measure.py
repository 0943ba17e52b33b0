import dataclasses

import gmlake
from gmlake.cap import smallest_device
from gmlake.replay import replay, trace_path
from gmlake.trace import load

GiB = 1 << 30
MiB = 1 << 20
base = gmlake.policies.get("gmlake")
pols = {"default": base,
        "fine@512MiB": dataclasses.replace(base, fine_page_headroom=512 * MiB),
        "fine@1GiB": dataclasses.replace(base, fine_page_headroom=1 * GiB),
        "fine@2GiB": dataclasses.replace(base, fine_page_headroom=2 * GiB),
        "pages2MiB": dataclasses.replace(base, expandable_page_large=2 * MiB),
        "expandable": gmlake.policies.get("expandable")}
for name in ("gpt2l-lora-ckpt-native", "opt350m-full-ckpt-native", "opt1.3b-lora-native"):
    t = load(trace_path(name))
    for label, pol in pols.items():
        dev, failed, probes = smallest_device(t, pol, resolution=0.001)
        rr = replay(t, pol, device_memory=int(dev))
        un = replay(t, pol)
        print(f"{name:26} {label:12} smallest {dev / GiB:7.3f} GiB  driver s at it {rr.driver_seconds:6.3f}  uncapped {un.driver_seconds:6.3f}  ooms {rr.ooms}")
