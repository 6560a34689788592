mod sim_kube;
