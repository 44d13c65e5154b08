#!/usr/bin/env python3
"""Writes OUT: the cluster file BASE with every network level at GBPS (an Ethernet-class network
under the same nodes), named NAME. Usage: slow_links_cluster.py OUT BASE GBPS NAME"""
import json
import sys

out, base, gbps, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
cluster = json.load(open(base))
cluster["name"] = name
for level in cluster["network"]["levels"]:
    level["bandwidth_GBps"] = gbps
json.dump(cluster, open(out, "w"))
